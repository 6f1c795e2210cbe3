"""A small fleet on this machine (fleet_lab.py): 3 hosts as network namespaces, each with its own
loop-device lab and the agent role; h1 runs two rule-evaluating Prometheus replicas (A, B); the
central role (2 Alertmanager peers in a cluster, Thanos Query, watcher, receiver) in the root
namespace. Cross-host traffic: TLS + basic auth (HTTP), mutual TLS (gRPC StoreAPI); each host pushes alerts
with its own secret through the central alert gates (fleet_auth.py, alert_gate.py).

In order, on one fleet:
0. From h2's namespace, h2's secret pushes an h2 alert and nothing else: no silence, no read, no
   alert for h1, no scrape of h1's sidecar; the Alertmanager peers are unreachable from a host.
   No listener of h1 (exporters, both Prometheus replicas, sidecars) nor of the central side
   answers Go's /debug/pprof/ without credentials.
1. Thanos Query returns each host's lineup series once (deduplicated across h1's replicas).
2. The dashboard's queries, unchanged, run against Thanos Query; its host variable spans the fleet.
3. A merge collapse on h1 pages exactly once, naming h1 (2 replicas x 2 Alertmanager peers).
4. Alertmanager peer 1 and h1's replica A killed, h3 stopped entirely: a new collapse on h1 still
   pages exactly once, and BlockStackHostDown pages once for h3.
Needs root, `make thanos`, `make ebpf-build`, `make deps`; about 3 minutes (setup 35 s).
The fleet runs on FLEET_SERVERS (blockstack_deploy.stack.SERVERS; default upstream: Prometheus 3 and
Alertmanager 0.31, `make upstream-servers`); `FLEET_SERVERS=debian,upstream` runs it on each.
"""

import collections
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import tempfile
import time

import netns
import pytest
from fleet_lab import fleet_lab

from blockstack_deploy import roles
from blockstack_lab import fio, loop
from blockstack_lab.api import Prometheus, request
from blockstack_lab.view import PAGE_ALERTS
from blockstack_testsupport.procs import wait_until
from page_receiver import received

pytestmark = [pytest.mark.root, pytest.mark.servers, pytest.mark.built, pytest.mark.long]  # Thanos

PAGE_TIMEOUT = 120  # rate window 20 s + for 15 s + group_wait 5 s, on a loaded 2-core machine
DUPLICATE_WINDOW = 25  # a second Alertmanager peer would send after --cluster.peer-timeout (15 s)
LINEUP = "host_device_lower_operation:node_disk_completed:lower_rate"


def check_prerequisites():
    if os.geteuid() != 0:
        pytest.fail(
            "the fleet test needs root (network namespaces, loop devices, BPF): run make test-fleet as root"
        )
    problems = roles.missing()
    if problems:
        pytest.fail(
            "fleet test prerequisites missing: "
            + "; ".join(problems)
            + " (make test-fleet builds them)"
        )


@pytest.fixture(scope="module", params=os.environ.get("FLEET_SERVERS", "upstream").split(","))
def fleet(request):
    saved = os.environ.get("BLOCKSTACK_SERVERS")
    os.environ["BLOCKSTACK_SERVERS"] = request.param  # every role's Prometheus and Alertmanager
    request.addfinalizer(
        lambda: (
            os.environ.pop("BLOCKSTACK_SERVERS")
            if saved is None
            else os.environ.update(BLOCKSTACK_SERVERS=saved)
        )
    )
    check_prerequisites()
    workdir = tempfile.mkdtemp(prefix="blockstack-fleet-")
    started = time.monotonic()
    with fleet_lab(
        workdir, replicas={"h1": ("A", "B")}, plain_devices={"h1": 2}, host_down_for="15s"
    ) as f:
        print(f"\nfleet up in {time.monotonic() - started:.0f} s ({workdir})")
        f.workdir = workdir
        wait_until("every agent target up through Thanos Query", lambda: _all_targets_up(f), 120, 2)
        yield f
    subprocess.run(["rm", "-rf", workdir], timeout=60)


def query(f, promql, dedup=True):
    return Prometheus(f.central.query_url(), auth=f.admin).query(promql, dedup=str(dedup).lower())


def _all_targets_up(f):
    up = query(f, 'up{job=~"node|blockstack|ebpf"}')
    hosts = collections.Counter(s["metric"]["host"] for s in up if s["value"][1] == "1")
    return all(hosts[h] == 3 for h in f.hosts)


def pages(f, predicate):
    """Page notifications (receiver page) holding a firing alert that matches predicate(labels)."""
    return list(
        {
            id(r): r
            for r, a in received(f.central.pages_file)
            if r["notification"]["receiver"] == "page"
            and a["status"] == "firing"
            and predicate(a["labels"])
        }.values()
    )


def collapse_pages(f, host, dev):
    name = loop.name(dev)
    return pages(
        f,
        lambda labels: (
            labels.get("alertname") in PAGE_ALERTS
            and labels.get("host") == host
            and name in (labels.get("device"), labels.get("stack"))
        ),
    )


@pytest.fixture
def reads():
    """reads(dev, nomerges=None): sequential batched direct reads of dev, with queue/nomerges set
    when given, until the test ends (then fio is stopped and the setting restored). Returns when
    they started."""
    with contextlib.ExitStack() as cleanup:

        def start(dev, nomerges=None):
            if nomerges:
                cleanup.enter_context(loop.sysfs_setting(dev, "queue/nomerges", nomerges))
            cleanup.enter_context(
                fio.background(
                    [f"--filename={dev}", "--size=64m", "--readonly", *fio.SEQ_BATCHED_READ],
                    runtime=300,
                    name="reads",
                )
            )
            return time.monotonic()

        yield start


H1_SILENCE = {  # h2 trying to silence h1
    "matchers": [{"name": "host", "value": "h1", "isRegex": False}],
    "startsAt": "2020-01-01T00:00:00Z",
    "endsAt": "2099-01-01T00:00:00Z",
    "createdBy": "h2",
    "comment": "h2 silencing h1",
}
HARMLESS_SILENCE = {  # the admin's, which h2 tries to delete
    **H1_SILENCE,
    "matchers": [{"name": "alertname", "value": "BlockStackNoSuchAlert", "isRegex": False}],
}


def test_a_hosts_secret_pushes_its_own_alerts_only(fleet):
    h2 = fleet.agents["h2"].secrets
    assert sorted(os.listdir(h2.dir)) == [
        "ca.crt",
        "h2.crt",
        "h2.key",
        "push-password",
        "scrape-password.bcrypt",
    ]
    mine = ("h2", open(h2.push_password_file).read().strip())
    gate = f"https://{fleet.central.alertmanager_addresses()[0]}"
    peer = f"http://127.0.0.1:{fleet.central.ports['alertmanager-1']}"
    h1 = fleet.hosts["h1"]
    sidecar = f"https://{h1.address}:{fleet.agents['h1'].ports['sidecar-A-http']}/metrics"
    admin = fleet.admin
    existing = json.loads(request(peer + "/api/v2/silences", admin, body=HARMLESS_SILENCE)[1])[
        "silenceID"
    ]
    seen = h2_attempts(fleet, mine, gate, peer, sidecar, existing)
    print("\nh2's secret:", json.dumps(seen))
    assert seen == {
        "push h2's alert": 200,
        "push an alert for h1": 403,
        "POST /api/v2/silences": 403,
        "DELETE /api/v2/silence/ID": 403,
        "GET /api/v2/alerts": 403,
        "GET /api/v2/status": 403,
        "scrape h1's sidecar": 401,
        "Alertmanager peer itself": "URLError",
    }, seen
    check_after_h2_attempts(fleet, peer, sidecar, existing)


def h2_attempts(fleet, mine, gate, peer, sidecar, existing):
    """What each request from h2's namespace with h2's secret gets: a status, or the error's
    name."""

    def from_h2(url, auth=mine, **kw):
        try:
            return netns.call_in(fleet.hosts["h2"].ns, request, url, auth, fleet.secrets.ca, **kw)[
                0
            ]
        except OSError as e:
            return type(e).__name__

    def alert(host):
        return [
            {
                "labels": {
                    "alertname": "BlockStackCredentialTest",
                    "host": host,
                    "severity": "info",
                },
                "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60)),
            }
        ]

    return {
        "push h2's alert": from_h2(gate + "/api/v2/alerts", body=alert("h2")),
        "push an alert for h1": from_h2(gate + "/api/v2/alerts", body=alert("h1")),
        "POST /api/v2/silences": from_h2(gate + "/api/v2/silences", body=H1_SILENCE),
        "DELETE /api/v2/silence/ID": from_h2(gate + f"/api/v2/silence/{existing}", method="DELETE"),
        "GET /api/v2/alerts": from_h2(gate + "/api/v2/alerts"),
        "GET /api/v2/status": from_h2(gate + "/api/v2/status"),
        "scrape h1's sidecar": from_h2(sidecar),
        "Alertmanager peer itself": from_h2(peer + "/api/v2/status"),
    }


def check_after_h2_attempts(fleet, peer, sidecar, existing):
    """The pushed alert reached the peers; the admin's silence still stands; the central's scrape
    user reads h1."""
    admin = fleet.admin
    alerts = json.loads(request(peer + "/api/v2/alerts", admin)[1])
    assert [
        a["labels"]["host"]
        for a in alerts
        if a["labels"]["alertname"] == "BlockStackCredentialTest"
    ] == ["h2"]
    states = {
        s["id"]: s["status"]["state"]
        for s in json.loads(request(peer + "/api/v2/silences", admin)[1])
    }
    assert states[existing] == "active" and list(states.values()).count("active") == 1, states
    assert (
        netns.call_in(fleet.hosts["h2"].ns, request, sidecar, fleet.scrape, fleet.secrets.ca)[0]
        == 200
    )


def test_no_pprof_without_credentials(fleet):
    """Go's /debug/pprof/ (CPU profiles on demand, heap and goroutine dumps) on every HTTP listener
    of an agent host, from inside its namespace, and of the central side: refused without
    credentials (401 behind basic auth, 403 at a gate, 404 at the metrics front or a Python
    server), while the scrapes and queries above go on with theirs."""
    h1, agent, central = fleet.hosts["h1"], fleet.agents["h1"], fleet.central
    on_h1 = {
        name: f"http://127.0.0.1:{agent.ports[name]}"
        for name in ("node", "blockstack", "ebpf", "prometheus-A", "prometheus-B")
    }
    on_h1.update(
        {
            f"sidecar-{r}": f"https://{h1.address}:{agent.ports[f'sidecar-{r}-http']}"
            for r in agent.replicas
        }
    )
    seen = {
        name: netns.call_in(h1.ns, request, url + "/debug/pprof/", None, fleet.secrets.ca)[0]
        for name, url in on_h1.items()
    }
    on_central = {
        name: f"http://127.0.0.1:{central.ports[name]}"
        for name in ("receiver", "alertmanager-1", "alertmanager-2", "watcher-A", "query-http")
    }
    on_central.update(
        {f"gate-{i}": f"https://{a}" for i, a in enumerate(central.alertmanager_addresses(), 1)}
    )
    seen.update(
        {
            f"central {name}": request(url + "/debug/pprof/", None, fleet.secrets.ca)[0]
            for name, url in on_central.items()
        }
    )
    print("/debug/pprof/ without credentials:", json.dumps(seen))
    assert not {name: code for name, code in seen.items() if code not in (401, 403, 404)}, seen
    # what the fleet needs still answers with its own credentials: the scrape user at the sidecar,
    # the admin at the watcher and Thanos Query
    sidecar = on_h1["sidecar-A"] + "/metrics"
    status, text = netns.call_in(h1.ns, request, sidecar, fleet.scrape, fleet.secrets.ca)
    assert status == 200 and "thanos_sidecar_prometheus_up 1" in text, (
        "the sidecar no longer reads its Prometheus"
    )
    assert request(f"http://127.0.0.1:{central.ports['watcher-A']}/-/ready", fleet.admin)[0] == 200


def test_thanos_query_returns_each_hosts_lineup_once(fleet):
    wait_until(
        "lineup series on every host",
        lambda: {s["metric"]["host"] for s in query(fleet, LINEUP)} == set(fleet.hosts),
        60,
        2,
    )
    deduped = query(fleet, LINEUP)
    raw = query(fleet, LINEUP, dedup=False)
    keys = [tuple(sorted(s["metric"].items())) for s in deduped]
    assert len(keys) == len(set(keys)), "duplicate series after deduplication"
    assert not any("replica" in s["metric"] for s in deduped)
    for h, host in fleet.hosts.items():
        mine = [s for s in deduped if s["metric"]["host"] == h]
        assert mine and all(
            s["metric"]["device"] == host.upper and s["metric"]["lower"] == host.lower for s in mine
        ), mine
        replicas = collections.Counter(
            s["metric"]["replica"] for s in raw if s["metric"]["host"] == h
        )
        assert set(replicas) == set(fleet.agents[h].replicas)
        assert all(n == len(mine) for n in replicas.values()), (h, replicas, len(mine))
    print(f"lineup: {len(deduped)} series deduplicated, {len(raw)} raw")


def test_dashboard_unchanged_against_thanos_query(fleet, reads):
    """The dashboard's queries, with h1's upper as the stack (the device variable: the upper and its
    lower, or one device in the repeated panels), over the last 2 minutes ($__range) at the 5 s
    scrape interval ($__rate_interval 20 s, Grafana's 4 x scrape; $__interval the 5 s step), as
    Grafana sends them to Thanos Query.
    That Grafana itself renders them is dashboards/tests/test_grafana.py's."""
    import blockstack_dashboard

    with open(blockstack_dashboard.OUTPUT) as fh:
        dashboard = json.load(fh)
    thanos = Prometheus(fleet.central.query_url(), auth=fleet.admin)
    h1 = fleet.hosts["h1"]
    reads(f"/dev/{h1.upper}")  # the stack at work, so that its rates and histograms exist
    sizes = f'host_device_operation:node_disk_request_size_sectors:avg{{host="h1", device=~"{h1.upper}|{h1.lower}"}}'
    wait_until(
        "request sizes of h1's stack through Thanos Query",
        lambda: len(thanos.query(sizes)) >= 2,
        90,
        2,
    )
    time.sleep(20)  # a $__rate_interval of every series at work
    end = math.ceil(time.time() / 5) * 5
    host = next(v for v in dashboard["templating"]["list"] if v["name"] == "host")["query"]["query"]
    match, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", host).groups()
    assert sorted(thanos.label_values(label, match, start=end - 120, end=end)) == sorted(
        fleet.hosts
    ), "the host variable must span the fleet"
    ran = with_data = 0
    shown = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            device = h1.upper if panel.get("repeat") == "device" else f"({h1.upper}|{h1.lower})"
            # Grafana's step and $__interval: the scrape interval, or the panel's minimum interval
            interval = panel.get("interval", "5s")
            text = (
                target["expr"]
                .replace("$__rate_interval", "20s")
                .replace("$__interval", interval)
                .replace("$__range", "120s")
                .replace("$host", "h1")
                .replace("$stack", h1.upper)
                .replace("$device", device)
            )
            result = thanos.query_range(
                text, end - 120, end, int(interval[:-1]) * {"s": 1, "m": 60}[interval[-1]]
            )
            ran += 1
            keys = [tuple(sorted(s["metric"].items())) for s in result]
            assert len(keys) == len(set(keys)), (
                f"{panel['title']}: duplicate series through Thanos: {text}"
            )
            assert not any(s["metric"].get("host") not in (None, "h1") for s in result), (
                f"{panel['title']}: {text}"
            )
            with_data += bool(result)
            if result:
                shown.add(panel["title"])
    # h1 has neither a snapshot nor jbd2 waits to show; every other panel shows its stack at work
    blank = {p["title"] for p in dashboard["panels"] if p.get("targets")} - shown
    assert all(t.startswith(("Snapshot", "jbd2")) for t in blank), (
        f"panels without data through Thanos: {blank}"
    )
    print(f"dashboard: {ran} queries through Thanos Query, {with_data} with data")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_cost_per_host(fleet):
    """Series per host (deduplicated, recording rules included), samples/s per replica (every
    series is scraped or evaluated every 5 s) and the memory of each component: the measured
    inputs of the per-100 / per-1,000 hosts figures in docs/fleet.md."""
    series = {
        s["metric"]["host"]: int(s["value"][1])
        for s in query(fleet, 'count by (host) ({__name__=~".+"})')
    }
    scraped = {
        s["metric"]["host"]: int(s["value"][1])
        for s in query(fleet, 'count by (host) ({job=~"node|blockstack|ebpf"})')
    }
    assert set(series) == set(fleet.hosts)
    per_device = {
        s["metric"]["host"]: int(s["value"][1])
        for s in query(fleet, 'count by (host) ({__name__=~".+", device!=""})')
    }
    devices = {
        s["metric"]["host"]: int(s["value"][1])
        for s in query(
            fleet, 'count by (host) (count by (host, device) ({__name__=~".+", device!=""}))'
        )
    }
    for h in sorted(series):
        print(
            f"{h}: {devices[h]} devices, {per_device[h]} series with a device label "
            f"({per_device[h] / devices[h]:.0f} per device), {series[h] - per_device[h]} without"
        )
    watched = Prometheus(
        f"http://127.0.0.1:{fleet.central.ports['watcher-A']}", auth=fleet.admin
    ).value('count({__name__=~".+"})')
    print(
        f"watcher: {watched:.0f} series for "
        f"{sum(len(a.replicas) for a in fleet.agents.values())} agent replicas"
    )
    for h in sorted(series):
        print(
            f"{h}: {series[h]} series ({scraped[h]} scraped, {series[h] - scraped[h]} from rules), "
            f"{series[h] / 5:.0f} samples/s per replica"
        )
    h1 = fleet.hosts["h1"]
    for name, proc in sorted(h1.procs.items()):
        print(f"h1 {name}: {rss_mib(proc.pid):.0f} MiB RSS")
    for name, proc in sorted(fleet.central_procs.items()):
        print(f"central {name}: {rss_mib(proc.pid):.0f} MiB RSS")
    assert all(n > 0 for n in series.values())


def test_collapse_pages_once_naming_the_host(fleet, reads):
    dev = fleet.hosts["h1"].plain[0]
    flipped = reads(dev, nomerges="2")
    page = wait_until("the h1 page", lambda: collapse_pages(fleet, "h1", dev), PAGE_TIMEOUT, 1)
    print(f"h1 paged {time.monotonic() - flipped:.0f} s after the collapse")
    time.sleep(DUPLICATE_WINDOW)
    sent = collapse_pages(fleet, "h1", dev)
    assert len(sent) == 1, f"expected exactly one page, got {len(sent)}: {sent}"
    labels = [a["labels"] for a in page[0]["notification"]["alerts"] if a["status"] == "firing"]
    assert all(lbl["host"] == "h1" and "replica" not in lbl for lbl in labels), labels
    assert page[0]["notification"]["groupLabels"]["host"] == "h1"
    others = pages(
        fleet, lambda lbl: lbl.get("host") != "h1" and lbl.get("alertname") in PAGE_ALERTS
    )
    assert not others, f"pages for other hosts: {others}"


def test_peer_and_replica_killed_host_stopped_still_pages_once(fleet, reads):
    fleet.central_procs["alertmanager-1"].send_signal(signal.SIGKILL)
    fleet.kill("h1", "prometheus-A")
    h3 = fleet.hosts["h3"]
    for name in list(h3.procs):
        fleet.kill("h3", name)
    netns.link_down(h3.ns)
    stopped = time.monotonic()
    dev = fleet.hosts["h1"].plain[1]
    flipped = reads(dev, nomerges="2")

    wait_until("the second h1 page", lambda: collapse_pages(fleet, "h1", dev), PAGE_TIMEOUT, 1)
    print(
        f"h1 paged {time.monotonic() - flipped:.0f} s after the collapse (1 peer, 1 replica left)"
    )
    down = wait_until(
        "the h3 host-down page",
        lambda: pages(fleet, lambda lbl: lbl.get("alertname") == "BlockStackHostDown"),
        PAGE_TIMEOUT,
        1,
    )
    print(f"h3 host-down paged {time.monotonic() - stopped:.0f} s after it stopped")
    time.sleep(DUPLICATE_WINDOW)
    assert len(collapse_pages(fleet, "h1", dev)) == 1
    down = pages(fleet, lambda lbl: lbl.get("alertname") == "BlockStackHostDown")
    assert len(down) == 1, down
    assert [a["labels"]["host"] for a in down[0]["notification"]["alerts"]] == ["h3"]
