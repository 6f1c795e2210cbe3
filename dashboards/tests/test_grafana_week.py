"""The dashboard over a week, in a real Grafana (12.4.0) and chromium: every collapse keeps its peak
at 15 minutes, 24 hours and 7 days, and every panel loads at each (its time and query cost printed).

The week is backfilled (blockstack_lab/week_history.py: `promtool tsdb create-blocks-from
openmetrics`, ~20 s) into the TSDB of Debian's Prometheus 2.42, started with Grafana by the stack of
blockstack_deploy (no exporter: the history is the data). Two pairs of collapses of loop0, each a
42 s split collapse and, 3 minutes later, a 36 s refused-merge collapse: "new" 40 s after the
stack's first sample (as in the lab run whose 24 h view showed its split collapse at 0), "old" mid
week. The dashboard under test is imported through Grafana's API as a user imports it (its
DS_PROMETHEUS input set to the provisioned Prometheus): the committed JSON, or the file named by
$BLOCKSTACK_DASHBOARD_JSON (e.g. an older version, to see this test fail on it).

The values checked are the ones the page received: each /api/ds/query answer of the lineup's
"Refused merges" and "Splits" panels, for the series L1 loop0 read, at the point whose interval
holds the collapse. Screenshots of each view go to $ARTIFACTS_DIR (default .artifacts/).
"""

import json
import os
import re
import urllib.parse

import pytest

import blockstack_dashboard
from blockstack_deploy.files import secret
from blockstack_deploy.stack import Stack
from blockstack_lab.api import request
from blockstack_lab.grafana_browser import Browser
from blockstack_lab.week_history import HOST, LOWER, UPPER, build, views

pytestmark = [pytest.mark.servers]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.environ.get("ARTIFACTS_DIR") or os.path.join(REPO, ".artifacts")
UNDER_TEST = os.environ.get("BLOCKSTACK_DASHBOARD_JSON") or blockstack_dashboard.OUTPUT
UID = "blockstack-merges-week"
REFUSED = "Refused merges per layer, peak per interval"
SPLITS = "Splits per layer, peak per interval"
PANELS = {"refused": REFUSED, "split": SPLITS}
SERIES = {"device": LOWER, "operation": "read"}
TOLERANCE = 0.10  # a peak within 10 % of the true one
# How much longer a panel's query may take at 7 days than at 15 minutes, as the browser times it,
# before it counts as slower: on a busy 2-core machine the same panel's query took 5 to 108 ms at
# 15 min from one run to the next, and the 7-day view's queries wait for each other in Grafana.
SLACK_MS = 400
# Panels slower at 7 days than at 15 minutes, each with the reason (their cost is printed).
SLOWER_AT_7_DAYS = {
    "Latency p50 / p99 per layer, peak per interval": "the highest p50/p99 of the rules' 20 s "
    "windows in each interval: a subquery stepped by 20 s, whose steps grow with the range "
    "(30,240 at 7 days against 45 at 15 min)",
}


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    """Prometheus (Debian's 2.42) holding the backfilled week, and Grafana, with the dashboard under
    test imported."""
    work = str(tmp_path_factory.mktemp("grafana-week"))
    t = build(work, os.path.join(work, "prometheus"))
    stack = Stack(work, components=("prometheus", "grafana"), scrape_interval="5s")
    with stack.running(timeout=120):
        password = secret(stack.grafana_password_file)
        import_dashboard(stack.url("grafana"), password, UNDER_TEST)
        yield stack, password, t


def import_dashboard(url, password, path):
    """POST /api/dashboards/import of the JSON at `path` under UID, its DS_PROMETHEUS input set to
    the provisioned datasource, as Dashboards > New > Import does."""
    with open(path) as f:
        dashboard = json.load(f)
    dashboard["uid"] = UID
    dashboard["title"] += " (week)"
    status, text = request(
        url + "/api/dashboards/import",
        ("admin", password),
        body={
            "dashboard": dashboard,
            "overwrite": True,
            "folderUid": "",
            "inputs": [
                {
                    "name": "DS_PROMETHEUS",
                    "type": "datasource",
                    "pluginId": "prometheus",
                    "value": blockstack_dashboard.CONFIG["datasource_uid"],
                }
            ],
        },
        timeout=60,
    )
    assert status == 200, text


@pytest.fixture(scope="module")
def seen(week):
    """{(pair, range name): view} for both pairs at each range, each view the dashboard opened in
    chromium at that range with every panel loaded: {"answers": {panel title: [(labels, [(time,
    value)], step)]}, "ms": {panel title: slowest query's milliseconds}, "legend": {...}}."""
    stack, password, t = week
    out = {}
    with Browser(stack.url("grafana"), password, viewport=(1500, 1000)) as b:
        b.login()
        for pair in ("new", "old"):
            for name, (start, end) in views(t, pair).items():
                if name == "7d" and ("new", name) in out:
                    out[pair, name] = out["new", name]  # one week holds both pairs
                    continue
                out[pair, name] = view(b, start, end, f"week-{pair}-{name}.png")
    return out


def view(b, start, end, shot):
    since = len(b.queries)
    b.open_dashboard(
        UID,
        {
            "orgId": 1,
            "from": start * 1000,
            "to": end * 1000,
            "var-host": HOST,
            "var-stack": UPPER,
            "var-device": "$__all",
            "refresh": "",
        },
    )
    states = b.load_every_panel()
    assert not b.failed, f"failed requests: {b.failed}"
    os.makedirs(ARTIFACTS, exist_ok=True)
    b.screenshot(os.path.join(ARTIFACTS, shot))
    answers, ms, executed = {}, {}, {}
    for q in b.queries[since:]:
        if not (q.get("response") or {}).get("results"):
            continue  # cancelled by the page (a variable resolved after it was sent): sent again
        title = q["request"].headers.get("x-panel-title") or ""
        ms[title] = max(ms.get(title, 0), q.get("ms") or 0)
        executed[title] = [
            f["schema"].get("meta", {}).get("executedQueryString", "")
            for r in ((q.get("response") or {}).get("results") or {}).values()
            for f in r.get("frames", [])[:1]
        ]
        if title in PANELS.values():  # the panel's last answer: its time series
            answers[title] = [
                series(f)
                for r in ((q.get("response") or {}).get("results") or {}).values()
                for f in r.get("frames", [])
                if len(f["schema"]["fields"]) == 2
            ]
    return {
        "answers": answers,
        "ms": ms,
        "executed": executed,
        "range": (start, end),
        "states": states,
        "legend": {p: b.legend(p) for p in PANELS.values()},
    }


def series(frame):
    """(labels, [(Unix seconds, value)], step seconds) of one data frame of /api/ds/query."""
    fields = frame["schema"]["fields"]
    times, values = frame["data"]["values"][:2]
    interval = fields[0].get("config", {}).get("interval")  # the step, milliseconds
    return (
        fields[1].get("labels") or {},
        [(t / 1000, v) for t, v in zip(times, values)],
        (interval or 0) / 1000,
    )


def shown(answers, start, stop):
    """The value the L1 loop0 read line shows for (start, stop): the highest of the points whose
    interval (the step from the point on) meets it; None without such a point or line."""
    found = None
    for labels, points, step in answers:
        if any(labels.get(k) != v for k, v in SERIES.items()):
            continue
        for t, v in points:
            if v is not None and t <= stop and t + step >= start:
                found = v if found is None else max(found, v)
    return found


def test_every_collapse_keeps_its_peak_at_every_range(week, seen):
    """Each collapse of 30 s or more (split pieces, refused merges; the new stack's and the
    week-old one's) shows its true rate within 10 % in the answers of its panel at 15 min, 24 h and
    7 days. The 24 h view showed the lab's split collapse at 0: the panels took the stack's layers
    at each point of the graph while their values came from the interval after it, so the
    interval in which the stack appeared was left out with the collapse in it."""
    _, _, t = week
    problems, table = [], []
    for (pair, kind), (start, stop, rate) in sorted(t.collapses.items()):
        for name in ("15m", "24h", "7d"):
            v = seen[pair, name]
            value = shown(v["answers"].get(PANELS[kind], []), start, stop)
            table.append(f"{pair:>3} {kind:>7} {name:>3}: true {rate:9.0f}/s, shown {value}")
            if value is None or abs(value - rate) > TOLERANCE * rate:
                problems.append(
                    f"{PANELS[kind]} at {name}: the {pair} {kind} collapse ({stop - start} s at "
                    f"{rate:.0f}/s) shows {value}"
                )
    print("\n" + "\n".join(table))
    assert not problems, "\n".join(problems)


def test_the_legends_show_the_peaks(week, seen):
    """What a reader reads: the Max of L1 loop0 read in the legends of "Refused merges" and
    "Splits" is the collapse's true rate, within 10 %, at 15 min and 24 h (each view holds one
    pair)."""
    _, _, t = week
    problems = []
    for (pair, kind), (_, _, rate) in sorted(t.collapses.items()):
        for name in ("15m", "24h"):
            row = seen[pair, name]["legend"][PANELS[kind]].get(f"L1 {LOWER} read")
            value = row and _number(row[1])
            if value is None or abs(value - rate) > TOLERANCE * rate:
                problems.append(f"{PANELS[kind]} at {name}: legend Max {row}, true {rate:.0f}/s")
    assert not problems, "\n".join(problems)


def test_every_panel_loads_at_every_range(week, seen):
    """No panel is in error at any range. Each panel's time in the browser and its cost in
    Prometheus (samples read, evaluation) at 15 min and 7 days are printed, not asserted: timings
    are a benchmark's (on this 2-core machine one panel's query took 5 to 250 ms at 15 min from
    run to run); a panel slower at 7 days than its 15 min time plus SLACK_MS is named in the
    table, with SLOWER_AT_7_DAYS' reason where known."""
    stack = week[0]
    short, long = seen["new", "15m"], seen["new", "7d"]
    problems = []
    table = ["browser 15m / 7d   Prometheus 15m / 7d (samples read, evaluation)   panel"]
    for title in sorted(short["ms"]):
        a, b = short["ms"][title], long["ms"].get(title)
        costs = [
            [cost(stack, text, v["range"]) for text in v["executed"].get(title, []) if text]
            for v in (short, long)
        ]
        table.append(
            f"{a:5.0f} / {b or 0:5.0f} ms   "
            + " / ".join(
                f"{sum(c[0] for c in cs):7d} {sum(c[1] for c in cs):4.0f} ms" for cs in costs
            )
            + f"   {title or '(variables)'}"
        )
        if b is None:
            problems.append(f"{title}: no query at 7 days")
        elif b > a + SLACK_MS:
            table[-1] += f"   SLOWER at 7 days: {SLOWER_AT_7_DAYS.get(title, 'reason not known')}"
    print("\n" + "\n".join(table))
    for key, v in seen.items():
        problems += [
            f"{key}: {title}: {s['error']}" for title, s in v["states"].items() if s["error"]
        ]
    assert not problems, "\n".join(problems)


def cost(stack, executed, span):
    """(samples read, milliseconds of evaluation) in Prometheus of one query Grafana ran ("Expr:
    ...\nStep: ..." of its answer) over the view's range: stats=all of the same range query."""
    m = re.match(r"Expr: (.*)\nStep: (.*)$", executed, re.S)
    assert m, executed
    step = sum(
        int(n) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[u]
        for n, u in re.findall(r"(\d+)(ms|h|m|s)", m[2])
    )
    start, end = span
    status, text = request(
        stack.url("prometheus")
        + "/api/v1/query_range?"
        + urllib.parse.urlencode(
            {"query": m[1], "start": start, "end": end, "step": step, "stats": "all"}
        ),
        timeout=120,
    )
    assert status == 200, text
    stats = json.loads(text)["data"]["stats"]
    return stats["samples"]["totalQueryableSamples"], stats["timings"]["evalTotalTime"] * 1000


def _number(text):
    """'98.3K req/s' -> 98300.0 (Grafana's SI prefixes)."""
    m = re.match(r"\s*([-\d.]+)\s*([kKMG]?)", text)
    return float(m.group(1)) * {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]
