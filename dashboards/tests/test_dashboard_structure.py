"""Structural checks of the committed dashboard JSON and of the Grafana provisioning files."""

import itertools
import json
import os
import re

import yaml
from dashboard_parts import common, stack_table

import blockstack_dashboard
from blockstack_exporter.settings import SETTINGS
from blockstack_rules import knobs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROVISIONING = os.path.join(REPO, "deploy", "grafana", "provisioning")
VARIABLE_USE = r"\$(?:\{{{0}(?:[:.}}])|{0}\b)|\[\[{0}(?::\w+)?\]\]"


def panels(dashboard):
    """Every panel, rows included, and the panels inside collapsed rows."""
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def data_panels(dashboard):
    return [p for p in panels(dashboard) if p["type"] != "row"]


def test_title_uid_and_schema(dashboard):
    assert dashboard["title"] == "Block Stack Merges"
    assert dashboard["uid"] == "blockstack-merges" == blockstack_dashboard.CONFIG["uid"]
    assert dashboard["schemaVersion"] >= 38  # Grafana 10's schema: no migration on load
    assert "id" not in dashboard or dashboard["id"] is None  # provisioning assigns it


def test_panel_ids_are_unique(dashboard):
    ids = [p["id"] for p in panels(dashboard)]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    assert not dupes, f"duplicate panel ids {dupes}"


def test_every_panel_and_query_uses_the_datasource_variable(dashboard):
    for p in data_panels(dashboard):
        assert p.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p.get("targets"), f"{p['title']}: no query"
        for t in p["targets"]:
            assert t.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, (
                p["title"],
                t["refId"],
            )
            assert t.get("expr", "").strip(), (p["title"], t["refId"])
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, v["name"]
    for a in dashboard["annotations"]["list"]:
        if not a.get("builtIn"):
            assert a["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, a["name"]


def test_every_variable_is_used(dashboard):
    variables = dashboard["templating"]["list"]
    names = [v["name"] for v in variables]
    assert names == ["datasource", "host", "stack", "device"]
    for v in variables:
        pattern = re.compile(VARIABLE_USE.format(re.escape(v["name"])))
        elsewhere = [json.dumps(p) for p in panels(dashboard)] + [
            json.dumps(a) for a in dashboard["annotations"]["list"]
        ]
        elsewhere += [
            json.dumps(o.get("query", "")) + json.dumps(o.get("datasource", ""))
            for o in variables
            if o is not v
        ]
        assert any(pattern.search(text) for text in elsewhere), (
            f"variable ${v['name']} is never used"
        )


# Panels about the host as a whole, whose queries follow $host only: which BPF programs its kernel
# runs.
HOST_WIDE = {"eBPF evidence"}


def test_every_query_follows_host_and_device(dashboard):
    """All panels follow the variables: each query selects $host, and $device (or the $stack it
    comes from) unless the panel is about the host as a whole (HOST_WIDE)."""
    for p in data_panels(dashboard):
        for t in p["targets"]:
            expr = t["expr"]
            assert '"$host"' in expr, (p["title"], t["refId"])
            assert '"$device"' in expr or '"$stack"' in expr or p["title"] in HOST_WIDE, (
                p["title"],
                t["refId"],
            )


def test_grid_positions_do_not_overlap(dashboard):
    boxes = []
    for p in dashboard["panels"]:  # top-level grid (panels of a collapsed row are not on it)
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["w"] > 0 and g["h"] > 0, p["title"]
        boxes.append((p["title"], g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
    for a, b in itertools.combinations(boxes, 2):
        overlap = a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]
        assert not overlap, f"{a[0]!r} overlaps {b[0]!r}"


def test_every_panel_tells_healthy_from_sick(dashboard):
    for p in data_panels(dashboard):
        text = p.get("description", "")
        assert "Healthy" in text and "Sick" in text, f"{p['title']}: description lacks healthy/sick"
        assert re.search(r"\d", text), f"{p['title']}: description quotes no figure"


def test_heatmaps_read_histogram_buckets(dashboard):
    for p in data_panels(dashboard):
        if p["type"] == "heatmap":
            for t in p["targets"]:
                assert (
                    t["format"] == "heatmap"
                    and "_bucket" in t["expr"]
                    and t["legendFormat"] == "{{le}}"
                )
            assert p["options"]["calculate"] is False


def test_collapse_annotation_targets_the_lineup_panels(dashboard):
    ann = [a for a in dashboard["annotations"]["list"] if not a.get("builtIn")]
    assert len(ann) == 1
    titles = {p["id"]: p["title"] for p in data_panels(dashboard)}
    assert ann[0]["filter"]["exclude"] is False
    assert {titles[i] for i in ann[0]["filter"]["ids"]} == {
        "Average request size per layer (upper vs lower)",
        "Refused merges per layer, peak per interval",
        "Splits per layer, peak per interval",
        "IOPS per layer",
        "Throughput per layer",
        "Merge ratio per layer",
    }
    assert 'ALERTS{alertname=~"' in ann[0]["expr"] and "BlockStackMergeCollapse" in ann[0]["expr"]


def test_the_collapse_alert_names_exist_in_alerts():
    """The annotation's alert names follow the rule files of alerts/."""
    names = set()
    for path in os.listdir(os.path.join(REPO, "alerts")):
        if path.endswith(".rules.yml"):
            with open(os.path.join(REPO, "alerts", path)) as f:
                for group in yaml.safe_load(f)["groups"]:
                    names.update(r["alert"] for r in group["rules"] if "alert" in r)
    pattern = re.compile(blockstack_dashboard.CONFIG["collapse_alerts"])
    assert any(pattern.fullmatch(n) for n in names), (
        f"no alert in alerts/ matches the annotation: {sorted(names)}"
    )


# --- provisioning ---------------------------------------------------------------------------------


def load(name):
    with open(os.path.join(PROVISIONING, name)) as f:
        return yaml.safe_load(f)


def test_datasource_provisioning(dashboard):
    doc = load("datasources/blockstack.yml")
    assert doc["apiVersion"] == 1
    (ds,) = doc["datasources"]
    assert ds["type"] == "prometheus" and ds["access"] == "proxy" and ds["url"].startswith("http")
    assert ds["uid"] == blockstack_dashboard.CONFIG["datasource_uid"]
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", ds["uid"])  # Grafana's uid rule
    default = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
    # provisioned, the variable starts on the datasource of this name (the uid is the import's
    # input)
    assert (
        default["current"]["text"] == ds["name"] == blockstack_dashboard.CONFIG["datasource_name"]
    )
    assert default["query"] == ds["type"]
    assert re.fullmatch(r"\d+s", ds["jsonData"]["timeInterval"])


def test_dashboard_provider_provisioning():
    doc = load("dashboards/blockstack.yml")
    assert doc["apiVersion"] == 1
    (p,) = doc["providers"]
    assert p["type"] == "file" and p["options"]["path"].startswith("/")
    assert set(p) <= {
        "name",
        "orgId",
        "folder",
        "folderUid",
        "type",
        "disableDeletion",
        "allowUiUpdates",
        "updateIntervalSeconds",
        "options",
    }
    assert set(p["options"]) <= {"path", "foldersFromFilesStructure"}


def test_variable_queries_are_one_line(dashboard):
    """Grafana's Prometheus datasource matches query_result(...) / label_values(...) with regexes
    whose `.` stops at a newline: a multi-line one is sent to /api/v1/series and refused (HTTP 400).
    """
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            assert "\n" not in query and re.fullmatch(
                r"(query_result|label_values)\(.+\)", query
            ), v["name"]


def test_the_datasource_is_an_import_input(dashboard):
    """As dashboards shared on grafana.com: one datasource input, DS_PROMETHEUS, which is the
    default of the $datasource variable and the only ${...} that is not a variable of the dashboard.
    """
    (ds_input,) = dashboard["__inputs"]
    assert ds_input["name"] == "DS_PROMETHEUS" and ds_input["type"] == "datasource"
    assert ds_input["pluginId"] == "prometheus"
    default = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
    assert default["current"]["value"] == "${DS_PROMETHEUS}"
    names = {v["name"] for v in dashboard["templating"]["list"]}
    used = set(
        re.findall(
            r"\$\{(\w+)", json.dumps({k: v for k, v in dashboard.items() if k != "__inputs"})
        )
    )
    assert used - names == {"DS_PROMETHEUS"}, used - names
    assert {r["id"] for r in dashboard["__requires"] if r["type"] == "panel"} == {
        p["type"] for p in data_panels(dashboard)
    }


def test_histogram_quantiles_stay_inside_the_histogram(dashboard):
    """No line pinned at the top bucket: every histogram_quantile is cut below the histogram's top."""
    for p in data_panels(dashboard):
        for t in p["targets"]:
            if "histogram_quantile" in t["expr"]:
                assert re.search(r"histogram_quantile\(.*\)\s*<=\s*[\d.]+", t["expr"], re.S), (
                    p["title"],
                    t["expr"],
                )


# --- colours: each setting as its finding's severity ----------------------------------------------


def _panel(dashboard, title):
    return next(p for p in data_panels(dashboard) if p["title"] == title)


def _field(panel, name):
    """{property id: value} of a table's override for the field `name`."""
    o = next(o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == name)
    return {p["id"]: p["value"] for p in o["properties"]}


def _threshold_colour(thresholds, value):
    colour = None
    for step in thresholds["steps"]:
        if step["value"] is None or value >= step["value"]:
            colour = step["color"]
    return colour


def _mapped_colour(props, value):
    return next(
        m["options"][str(value)]["color"] for m in props["mappings"] if str(value) in m["options"]
    )


def test_settings_take_their_findings_colours(dashboard):
    """Every panel colouring a setting colours it as the doctor's check (checks.py, the exporter's
    blockstack_finding) judges that value at the knobs' thresholds: the severity's colour where
    the check finds something, green (or none on a time series) where it finds nothing. Red,
    the page's colour, only for a critical finding (not for 4 KiB snapshot chunks, an info
    finding, nor for nomerges 2, a warning)."""
    from blockstack_exporter import checks
    from blockstack_exporter import knobs as finding_knobs

    k = finding_knobs.load(required=checks.KNOBS)
    colours = common.SEVERITY_COLOURS

    def judged(check, **parts):
        h = checks.Host()
        for name, info in parts.pop("devices", {"sda": "disk"}).items():
            h.devices[name] = {"kind": info, "name": name}
            h.lower[name] = []
        for key, value in parts.items():
            if key == "lower":
                h.lower.update(value)
            else:
                setattr(h, key, value)
        found = [f.severity for f in checks.evaluate(h, k) if f.check == check]
        return found[0] if found else None

    def expect(severity, healthy="green"):
        return colours[severity] if severity else healthy

    seen = []
    chunk = _panel(dashboard, "Snapshot chunk size")["fieldConfig"]["defaults"]["thresholds"]
    for size in (4096, 32768, 65536, 262144, 524288):
        severity = judged(
            "snapshot_chunk_small",
            devices={"dm-3": "dm"},
            snapshots={"dm-3": {"name": "vg-snap", "chunk": size, "origin": "dm-2"}},
        )
        seen.append(severity)
        assert _threshold_colour(chunk, size) == expect(severity), size
    use = _panel(dashboard, "Snapshot COW use")["fieldConfig"]["defaults"]["thresholds"]
    for ratio in (0.1, 0.39, 0.4, 0.8, 0.94, 0.95, 0.99):
        severity = judged(
            "snapshot_cow_filling",
            devices={"dm-3": "dm"},
            snapshots={"dm-3": {"name": "vg-snap", "used": ratio * 1000, "size": 1000}},
        )
        seen.append(severity)
        assert _threshold_colour(use, ratio) == expect(severity, "transparent"), ratio
    journal = _panel(dashboard, "ext4 journal size")["fieldConfig"]["defaults"]["thresholds"]
    for size in (4 << 20, 128 << 20, 1 << 30, 2 << 30):
        severity = judged(
            "ext4_journal_small",
            ext4={
                "sda": {"mountpoint": "/srv", "journal": size, "options": {"dioread_nolock": ""}}
            },
        )
        assert _threshold_colour(journal, size) == expect(severity), size
    options = _field(_panel(dashboard, "ext4 effective mount options"), "option")
    assert (
        _mapped_colour(options, "dioread_nolock") == colours["info"]
    )  # the finding's least severity
    stack = _panel(dashboard, stack_table.TITLE)
    max_sectors = _field(stack, "max_sectors_kb")["thresholds"]
    for kb in (4, 32, 64, 127, 128, 512, 1280):
        severity = judged(
            "max_sectors_low",
            queue={"sda": {"max_sectors_kb": kb * 1024, "max_hw_sectors_kb": 32767 * 1024}},
        )
        seen.append(severity)
        assert _threshold_colour(max_sectors, kb) == expect(severity), kb
    nomerges = _field(stack, "nomerges")
    for value in (0, 1, 2):
        beneath = judged(
            "nomerges_beneath_stack",
            devices={"dm-0": "dm", "sda": "disk"},
            lower={"dm-0": ["sda"]},
            queue={"sda": {"nomerges": value}},
        )
        alone = judged("nomerges", queue={"sda": {"nomerges": value}})
        seen += [beneath, alone]
        assert _mapped_colour(nomerges, 10 + value) == expect(beneath), (
            value
        )  # the query adds 10 beneath a stack
        assert _mapped_colour(nomerges, value) == expect(alone), value
    state = _field(_panel(dashboard, "Snapshot state"), "state")
    for value in ("valid", "merging", "invalid", "overflow", "merge_failed"):
        severity = judged(
            "snapshot_invalid",
            devices={"dm-3": "dm"},
            snapshots={"dm-3": {"name": "vg-snap", "state": value}},
        )
        seen.append(severity)
        assert _mapped_colour(state, value) == expect(severity), value
    assert {"info", "warning", "critical", None} <= set(seen)  # each colour was put to the test


def promtool_eval(tmp_path, name, expr, series, expected):
    """Evaluate expr at 1m with promtool on input series {series: values}, expecting samples
    {labels: value}."""
    import subprocess

    case = {
        "name": name,
        "interval": "5s",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "promql_expr_test": [
            {
                "expr": expr,
                "eval_time": "1m",
                "exp_samples": [{"labels": k, "value": v} for k, v in expected.items()],
            }
        ],
    }
    path = tmp_path / "case.test.yml"
    path.write_text(
        yaml.safe_dump({"rule_files": [], "evaluation_interval": "5s", "tests": [case]})
    )
    r = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_nomerges_column_adds_10_beneath_a_stack(dashboard, tmp_path):
    """The stack table's nomerges query, evaluated by promtool on the NVMe incident's stack
    (nvme1n1 beneath dm-0 and dm-1, both beneath dm-3): nomerges, plus 10 where the device sits
    beneath another one (the mapping's colours above rely on it; an error would leave the column
    empty)."""
    stack = _panel(dashboard, stack_table.TITLE)
    expr = _column_expr(stack, "nomerges").replace("$host", "h").replace("$device", ".+")
    nomerges = {"dm-3": 0, "dm-0": 0, "dm-1": 0, "nvme1n1": 2, "sdb": 1}
    beneath = [
        ("dm-3", "dm-0", 1),
        ("dm-3", "dm-1", 1),
        ("dm-3", "nvme1n1", 2),
        ("dm-0", "nvme1n1", 1),
        ("dm-1", "nvme1n1", 1),
    ]
    series = {
        f'blockstack_queue_nomerges{{job="blockstack",host="h",device="{d}"}}': f"{v}x20"
        for d, v in nomerges.items()
    }
    series.update(
        {
            f'blockstack_device_beneath_info{{job="blockstack",host="h",device="{d}",lower="{low}",'
            f'depth="{depth}"}}': "1x20"
            for d, low, depth in beneath
        }
    )
    expected = {"dm-3": 0, "dm-0": 10, "dm-1": 10, "nvme1n1": 12, "sdb": 1}
    promtool_eval(
        tmp_path,
        "nomerges column",
        expr,
        series,
        {f'{{host="h",device="{d}"}}': v for d, v in expected.items()},
    )


def _organize(panel):
    (options,) = [t["options"] for t in panel["transformations"] if t["id"] == "organize"]
    return options


def _column_expr(panel, header):
    """The query whose value a table shows as the column `header` (renamed from "Value #REF")."""
    renamed = _organize(panel)["renameByName"]
    (ref,) = [key.removeprefix("Value #") for key, name in renamed.items() if name == header]
    return next(t["expr"] for t in panel["targets"] if t["refId"] == ref)


def test_the_stack_table_has_a_column_per_setting_with_one(dashboard, tmp_path):
    """Each SETTINGS row with a dashboard column (exporters/blockstack_exporter/settings.py) is a
    column of the stack table, in the rows' order and headed by its file. Its query shows the
    metric divided by the column's divisor (promtool); below healthy_from (a knob or a number of
    bytes) its cells are blue (info), from it green; its texts are the cells' value mappings.
    Every query's value is a named column or hidden, and the scheduler has its column."""
    stack = _panel(dashboard, stack_table.TITLE)
    organize = _organize(stack)
    order = sorted(organize["indexByName"], key=organize["indexByName"].get)
    rows = [r for r in SETTINGS if r.column is not None]
    assert rows
    assert [name for name in order if name in {r.file for r in SETTINGS}] == [r.file for r in rows]
    assert "scheduler" in order
    for t in stack["targets"]:
        value = f"Value #{t['refId']}"
        assert value in organize["renameByName"] or organize["excludeByName"].get(value), value
    fields = {
        o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
        for o in stack["fieldConfig"]["overrides"]
    }
    k = knobs.load()
    for shown, row in enumerate(rows, start=3):
        column = row.column
        expr = _column_expr(stack, row.file).replace("$host", "h").replace("$device", ".+")
        series = f'{row.name}{{job="blockstack",host="h",device="sda"}}'
        promtool_eval(
            tmp_path,
            row.file,
            expr,
            {series: f"{shown * column.divisor}x20"},
            {'{host="h",device="sda"}': shown},
        )
        field = fields.get(row.file, {})
        floor = column.healthy_from
        if floor is None:
            assert "thresholds" not in field, row.file
        else:
            floor = k[floor] if isinstance(floor, str) else floor
            assert field["thresholds"]["steps"] == [
                {"value": None, "color": common.INFO},
                {"value": floor / column.divisor, "color": common.HEALTHY},
            ], row.file
            assert field["custom.cellOptions"]["type"] == "color-background", row.file
        for value, text in column.texts:
            mapped = [
                m["options"][str(value)] for m in field["mappings"] if str(value) in m["options"]
            ]
            assert [m["text"] for m in mapped] == [text], (row.file, value)


# --- truthful at every range ----------------------------------------------------------------------

# A recording rule's series computed from counters over the rules' 20 s window
# (level:metric:operation with a node_disk_ or ebpf_ metric): one window in every step of a long
# range, unless summarised.
WINDOWED = re.compile(
    r"(?:(\w+)\()?\b(\w+:(?:node_disk|ebpf)_\w+:\w+)\{[^}]*\}"
    r"(\[[^\]]*\](?: @ end\(\))?(?: offset -?\$?\w+)?)?"
)
SUMMARIES = {"max_over_time", "avg_over_time", "sum_over_time"}
INTERVAL = "[$__interval] offset -$__interval"  # queries.INTERVAL
RANKING = "[$__range] @ end() offset -$__interval"  # queries.named_cgroups()
LAYER_JOIN = "* on (host, device) group_left (depth, name)"  # queries.per_layer()


def test_windowed_rules_are_summarised_over_each_interval(dashboard):
    """The 20 s-window rules sampled at Grafana's 2-minute step show one window in six ("Refused
    merges per layer" at 7.80 req/s over 24 h for a device that refused ~303,000/s). Every such
    series in a time series panel is summarised over each interval of the graph, the one starting at
    each point (Grafana ends a range at the last whole step: a window ending at each point never
    reaches the latest one); a panel that keeps the peak says so in its title; a rate over another
    window than $__rate_interval is a peak's subquery, stepped by that window (a subquery's default
    step is the server's evaluation interval: Thanos Query's 1m left a 15 min view of the fleet
    nearly empty) in a panel whose minimum interval is that window (so that every interval of the
    graph holds a step)."""
    for p in data_panels(dashboard):
        if p["type"] != "timeseries":
            continue
        for t in p["targets"]:
            expr = t["expr"]
            for fn, name, window in WINDOWED.findall(expr):
                # or a ranking, the same at every point: over the whole range, to its last interval
                ranking = fn == "sum_over_time" and window == RANKING
                assert ranking or fn in SUMMARIES and window == INTERVAL, (
                    p["title"],
                    name,
                    fn,
                    window,
                )
            for window in re.findall(r"\brate\([^\[]*\[([^\]]+)\]", expr):
                assert window == "$__rate_interval" or (
                    f"[$__interval:{window}] offset -$__interval)" in expr
                    and p.get("interval") == window
                ), (p["title"], window, p.get("interval"))
            values = expr.split(LAYER_JOIN)[0]  # the layers' part has its own max_over_time
            if "max_over_time(" in values:
                assert "peak per interval" in p["title"], p["title"]
            if LAYER_JOIN in expr:
                # the layers at any time of each point's interval, as the values: taken at the
                # point alone, the interval in which a stack appeared was dropped with its
                # collapse (a 42 s split collapse at 0 at 24 h; test_grafana_week.py)
                layers = expr.split(LAYER_JOIN)[1]
                for selector in ("blockstack_device_beneath_info{", "blockstack_device_info{"):
                    assert f"max_over_time({selector}" in layers, (p["title"], selector)


def test_every_empty_panel_says_so_in_words(dashboard):
    """An empty heatmap's legend would read "∞undefined req/s ... -∞undefined req/s": a heatmap's
    query answers only where there were observations (its own "No data" then); every other panel has
    a noValue."""
    for p in data_panels(dashboard):
        if p["type"] == "heatmap":
            for t in p["targets"]:
                assert re.search(r'and on \(\) \(sum\(.*le="\+Inf".*\) > 0\)', t["expr"], re.S), p[
                    "title"
                ]
        else:
            assert re.search(r"[A-Za-z]{2}", p["fieldConfig"]["defaults"].get("noValue", "")), p[
                "title"
            ]


REDS = re.compile(r"(red|#(?:f2495c|e02f44|c4162a|ff7383|e24d42|bf1b00))$", re.I)


def test_red_is_for_alarms_only(dashboard):
    """The classic palette draws the fifth series red, beside the red collapse bands. No series of a
    time series panel takes a palette with red or a red colour; a firing critical alert's row is
    red."""
    for p in data_panels(dashboard):
        if p["type"] != "timeseries":
            continue
        colour = p["fieldConfig"]["defaults"].get(
            "color", {"mode": "palette-classic", "fixedColor": ""}
        )
        assert colour["mode"] in ("shades", "fixed") and not REDS.search(colour["fixedColor"]), (
            p["title"],
            colour,
        )
        for o in p["fieldConfig"]["overrides"]:
            for prop in o["properties"]:
                if prop["id"] == "color":
                    assert not REDS.search(prop["value"].get("fixedColor", "")), (p["title"], o)
    alerts = _panel(dashboard, "Firing alerts")
    severity = _field(alerts, "severity")
    assert (
        _mapped_colour(severity, "critical") == "red"
        and _mapped_colour(severity, "warning") != "red"
    )
    assert severity["custom.cellOptions"]["applyToRow"] is True
    # the longest alert name of alerts/ fits, at 8 px a character
    names = set()
    for path in os.listdir(os.path.join(REPO, "alerts")):
        if path.endswith(".rules.yml"):
            with open(os.path.join(REPO, "alerts", path)) as f:
                names.update(
                    r["alert"]
                    for g in yaml.safe_load(f)["groups"]
                    for r in g["rules"]
                    if "alert" in r
                )
    assert _field(alerts, "alertname")["custom.minWidth"] >= 8 * max(map(len, names)), max(
        names, key=len
    )


def test_every_axis_has_a_unit(dashboard):
    """Every time series and stat has a unit (request size: sectors), every heatmap a unit on its y
    axis and on its cells (the tables of settings carry their unit in the column's name)."""
    for p in data_panels(dashboard):
        if p["type"] in ("timeseries", "stat"):
            assert p["fieldConfig"]["defaults"].get("unit") not in (None, "", "none", "short"), p[
                "title"
            ]
        if p["type"] == "heatmap":
            assert p["options"]["yAxis"].get("unit") and p["options"]["cellValues"].get("unit"), p[
                "title"
            ]


def test_every_series_has_a_legend_row(dashboard):
    """A legend beneath an 8-wide graph shows about 2.5 of 6 series (it gets at most a third of the
    panel's height). Every time series legend is a table at the right of a panel half the width at
    least and 9 rows high (the browser test checks that no row is out of sight)."""
    for p in data_panels(dashboard):
        if p["type"] == "timeseries":
            legend = p["options"]["legend"]
            assert (
                legend["showLegend"]
                and legend["displayMode"] == "table"
                and legend["placement"] == "right"
            ), p["title"]
            assert "max" in legend["calcs"], p["title"]
            assert p["gridPos"]["w"] >= 12 and p["gridPos"]["h"] >= 9, (p["title"], p["gridPos"])


def test_the_ext4_incident_options_come_first(dashboard, tmp_path):
    """dioread_nolock without scrolling the options table: its query ranks the incident's options,
    dioread_* highest, and the rest 1 (promtool), and the table sorts by that rank, highest first.
    """
    options = _panel(dashboard, "ext4 effective mount options")
    (target,) = options["targets"]
    expr = target["expr"].replace("$host", "h").replace("$device", ".+")
    present = {
        "rw": "",
        "dioread_nolock": "",
        "nodelalloc": "",
        "data": "ordered",
        "commit": "5",
        "barrier": "",
        "errors": "remount-ro",
    }
    series = {
        f'blockstack_ext4_option_info{{job="blockstack",host="h",device="loop1",mountpoint="/srv",'
        f'option="{o}",value="{v}"}}': "1x20"
        for o, v in present.items()
    }
    rank = {"dioread_nolock": 4, "nodelalloc": 3, "data": 2, "commit": 2}
    promtool_eval(
        tmp_path,
        "ext4 options ranked",
        expr,
        series,
        {  # an empty label is no label
            f'{{host="h",device="loop1",mountpoint="/srv",option="{o}"{f",value={v!r}" if v else ""}}}'.replace(
                "'", '"'
            ): rank.get(o, 1)
            for o, v in present.items()
        },
    )
    (sort,) = [t for t in options["transformations"] if t["id"] == "sortBy"]
    assert sort["options"]["sort"] == [{"field": "ext4 incident", "desc": True}]


def test_the_provisioned_copy_queries_the_provisioned_datasource(dashboard, tmp_path):
    """Left as the literal ${DS_PROMETHEUS}, a provisioned dashboard's $datasource would query
    whichever datasource is the default. Provisioning writes a copy with the import input resolved
    to the provisioned datasource's uid, as an import does."""
    from blockstack_deploy import grafana

    (ds,) = load("datasources/blockstack.yml")["datasources"]
    dest = grafana.provisioned_dashboards(str(tmp_path), [(ds["type"], ds["uid"])])
    with open(os.path.join(dest, os.path.basename(blockstack_dashboard.OUTPUT))) as f:
        text = f.read()
    assert "${DS_" not in text
    (variable,) = [v for v in json.loads(text)["templating"]["list"] if v["name"] == "datasource"]
    assert variable["current"]["value"] == ds["uid"]


# --- whose I/O ------------------------------------------------------------------------------------

WHOSE_BYTES = "host_device_operation_cgroup:ebpf_block_cgroup_bio_bytes:rate"
WHOSE_EVENTS = "host_device_operation_cgroup:ebpf_block_cgroup_collapse_events:rate"


def test_whose_io_is_a_panel_per_device_from_the_cgroup_rules(dashboard):
    """Each device of the stack has a "Whose I/O" panel beside its other per-device panels
    (repeated by $device), reading the per-cgroup recording rules of alerts/: bytes per second
    on the left axis, refused merges + splits per second on the right."""
    (whose,) = [p for p in data_panels(dashboard) if p["title"].startswith("Whose I/O")]
    assert whose["repeat"] == "device" and "$device" in whose["title"]
    per_device = [p["title"] for p in data_panels(dashboard) if p.get("repeat") == "device"]
    assert per_device[-1] == whose["title"] and len(per_device) > 1  # after the others
    with open(os.path.join(REPO, "alerts", "recording.rules.yml")) as f:
        records = {r.get("record") for g in yaml.safe_load(f)["groups"] for r in g["rules"]}
    exprs = {t["refId"]: t["expr"] for t in whose["targets"]}
    assert WHOSE_BYTES in exprs["A"] and WHOSE_EVENTS in exprs["B"]
    assert {WHOSE_BYTES, WHOSE_EVENTS} <= records
    assert [t["legendFormat"] for t in whose["targets"]] == [
        "bytes {{cgroup}}",
        "refused + split {{cgroup}}",
    ]
    assert whose["fieldConfig"]["defaults"]["unit"] == "Bps"
    (right,) = whose["fieldConfig"]["overrides"]
    assert right["matcher"] == {"id": "byFrameRefID", "options": "B"}
    props = {p["id"]: p["value"] for p in right["properties"]}
    assert props["unit"] == "reqps" and props["custom.axisPlacement"] == "right"


def test_whose_io_names_5_cgroups_over_the_range_and_sums_the_rest_as_other(dashboard, tmp_path):
    """promtool on the panel's queries: per cgroup, reads and writes summed; 5 cgroups by name (the
    BPF's named slots), ranked once over the whole range: a cgroup with refused merges or splits
    first, however few its bytes, then the busiest by bytes, also one busy before the point and
    idle in it; every other cgroup summed as "other". Refused + split is 0 for a named cgroup with
    bytes and nothing counted, and another device's cgroups never show."""
    (whose,) = [p for p in data_panels(dashboard) if p["title"].startswith("Whose I/O")]
    series = {}

    def rate(record, cgroup, value, operation="read", device="loop0", parent="system.slice"):
        labels = f'host="h",device="{device}",operation="{operation}",cgroup="{cgroup}"'
        if parent:  # the rules' "other" has none
            labels += f',parent="{parent}"'
        series[f"{record}{{{labels}}}"] = value if isinstance(value, str) else f"{value}x30"

    for i in range(1, 8):  # c1 .. c7, c7 busiest at the point with its writes
        rate(WHOSE_BYTES, f"c{i}", 100 * i)
    rate(WHOSE_BYTES, "c7", 50, "write")
    rate(WHOSE_BYTES, "c8", "_x5 100000x4 _x21")  # the busiest in the range: 25 s to 45 s
    rate(WHOSE_BYTES, "other", 5, parent="")
    rate(WHOSE_BYTES, "c9", 10000, device="loop1")
    rate(WHOSE_EVENTS, "c1", 30)
    rate(WHOSE_EVENTS, "other", 3, parent="")
    rate(WHOSE_EVENTS, "c9", 300, device="loop1")

    def labels(cgroup):
        parent = ',parent="system.slice"' if cgroup != "other" else ""
        return f'{{host="h",device="loop0",cgroup="{cgroup}"{parent}}}'

    # at 1 m: c8 named but without a point; c4, c3, c2 and the BPF's "other" are "other"
    top = {"c1": 100, "c7": 750, "c6": 600, "c5": 500, "other": 400 + 300 + 200 + 5}
    expected = {
        "A": {labels(c): v for c, v in top.items()},
        "B": {**{labels(c): 0 for c in top}, labels("c1"): 30, labels("other"): 3},
    }
    for t in whose["targets"]:
        expr = (
            t["expr"]
            .replace("$host", "h")
            .replace("$device", "loop0")
            .replace("$__interval", "20s")
            .replace("$__range", "1m")
        )
        promtool_eval(tmp_path, f"whose I/O {t['refId']}", expr, series, expected[t["refId"]])
