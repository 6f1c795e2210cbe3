"""Every query of the committed dashboard, with its variables substituted the way Grafana would
(dashboards/grafana_sim.py), runs against the lab's Prometheus over the lab window with
/api/v1/query_range and returns data for the lab's loop devices. One test case per query.

The lab (dashboards/lab_run.py): ext4 on loopU (direct-io) on a file on ext4 on loopL; healthy,
collapsed (nomerges=2, max_sectors_kb=4 on loopL) and fsync phases; Prometheus scrapes and
evaluates every 2 s (production: 5 s).

Every test runs twice, on a lab run per set of servers (blockstack_lab.stack.SERVERS: Debian's
Prometheus 2.42 and the pinned Prometheus 3), and each query's result must have the same shape on
both: the same label names, the same lab devices and the same histogram buckets (`le` compared as
numbers: Prometheus 3 stores le="512" as le="512.0").
"""
import json
import math
import os

import pytest

import blockstack_dashboard
import lab_run
from blockstack_lab.stack import SERVERS
from grafana_sim import Grafana

with open(blockstack_dashboard.OUTPUT) as _f:
    DASHBOARD = json.load(_f)

# Panels that cannot have data on this machine, each with the reason. Their queries must still
# parse and run without error; an empty result is allowed for them and for nothing else.
NO_DM = ("this kernel has no device-mapper (no dm-* in /sys/block, dmsetup cannot create a "
         "snapshot), so the dm collector publishes no snapshot series")
EXPECTED_EMPTY = {
    "Snapshot COW use": NO_DM,
    "Snapshot COW bytes used / size": NO_DM,
    "Snapshot time until COW full": NO_DM,
    "Snapshot chunk size": NO_DM,
    "Snapshot state": NO_DM,
}
# Panels whose results name one device rather than every layer: alerts name the device they
# are about (the collapsed lower, or the layer the eBPF signature saw).
ANY_LAB_DEVICE = {"Firing alerts"}


def queries():
    for p in DASHBOARD["panels"]:
        for t in p.get("targets", []):
            devices = ("upper", "lower") if p.get("repeat") == "device" else (None,)
            for dev in devices:
                suffix = f"-{dev}" if dev else ""
                yield pytest.param(p, t, dev, id=f"{p['id']}{t['refId']}{suffix}:{p['title']}")


@pytest.fixture(scope="module", params=list(SERVERS))
def lab(request, tmp_path_factory):
    """conftest's lab run, once per set of servers (selected for lab_run's Stack by BLOCKSTACK_SERVERS)."""
    saved = os.environ.get("BLOCKSTACK_SERVERS")
    os.environ["BLOCKSTACK_SERVERS"] = request.param
    try:
        why = lab_run.missing_requirements()
        if why:  # a core test: fail loudly rather than skip (make test installs and builds all of it)
            pytest.fail(f"lab run impossible here: {why}")
        with lab_run.lab_run(str(tmp_path_factory.mktemp(f"dashboard-lab-{request.param}"))) as run:
            assert run.stack.servers == request.param
            yield run
    finally:
        if saved is None:
            os.environ.pop("BLOCKSTACK_SERVERS", None)
        else:
            os.environ["BLOCKSTACK_SERVERS"] = saved


# {query id: {servers: shape}}: filled by test_query_returns_lab_data on each lab run.
SHAPES = {}


def shape(result, lab):
    """What must not depend on the Prometheus version: label names, lab devices by role, buckets."""
    roles = {lab.upper: "upper", lab.lower: "lower"}
    return (frozenset(name for s in result for name in s["metric"]),
            frozenset(roles[s["metric"]["device"]] for s in result if s["metric"].get("device") in roles),
            frozenset(float(s["metric"]["le"]) for s in result if "le" in s["metric"]))


@pytest.fixture(scope="module")
def grafana(lab):
    g = Grafana(lab.stack.url("prometheus"), DASHBOARD, lab.start, lab.end,
                scrape_interval=float(lab_run.SCRAPE_INTERVAL.rstrip("s")))
    g.choose("datasource", blockstack_dashboard.CONFIG["datasource_uid"])
    g.choose("host", lab.stack.host)
    g.choose("stack", lab.upper)
    g.choose("device", "$__all")
    return g


def finite(result):
    return any(math.isfinite(float(v)) for s in result for _, v in s.get("values", []))


def test_variables_resolve_to_the_lab_stack(grafana, lab):
    assert lab.stack.host in grafana.variable_options("host")
    assert lab.upper in grafana.variable_options("stack")
    assert lab.lower not in grafana.variable_options("stack")  # it has a holder: not a top
    devices = grafana.variable_options("device")
    assert {lab.upper, lab.lower} <= set(devices)
    assert grafana.values["device"] == devices  # All
    assert grafana.interpolate('device=~"$device"') == 'device=~"(' + "|".join(devices) + ')"'


@pytest.mark.parametrize("panel,target,repeat_device", queries())
def test_query_returns_lab_data(grafana, lab, panel, target, repeat_device):
    overrides = {"device": getattr(lab, repeat_device)} if repeat_device else None
    text, step, result = grafana.query_range(target["expr"], panel.get("maxDataPoints"), overrides)
    assert "$" not in text.replace('"$1"', ""), f"unsubstituted variable in {text}"
    reason = EXPECTED_EMPTY.get(panel["title"])
    if reason:
        assert not os.path.exists("/sys/module/dm_snapshot") or result, reason
        return  # ran without error; empty allowed: see EXPECTED_EMPTY
    assert result, f"no data for\n{text}"
    assert finite(result), f"only NaN for\n{text}"
    devices = {s["metric"]["device"] for s in result if "device" in s["metric"]}
    lab_devices = {lab.upper, lab.lower}
    if not devices:
        # An aggregate over $device (a heatmap's sum by (le)): $device holds only the stack's layers.
        assert 'device=~"' in text
    elif repeat_device:
        assert devices == {getattr(lab, repeat_device)}
    elif panel["title"] in ANY_LAB_DEVICE:
        assert devices & lab_devices, f"no lab device among {devices}"
    else:
        assert lab_devices <= devices, f"lab devices {lab_devices - devices} missing among {devices}"
    if panel["title"] not in ANY_LAB_DEVICE:  # alerts' labels depend on which alert fired
        shapes = SHAPES.setdefault((panel["id"], target["refId"], repeat_device), {})
        shapes[lab.stack.servers] = shape(result, lab)
        assert len(set(shapes.values())) == 1, f"the result differs between servers: {shapes}\n{text}"


def test_collapse_annotation_fires_in_the_collapsed_phase(grafana, lab):
    (ann,) = [a for a in DASHBOARD["annotations"]["list"] if not a.get("builtIn")]
    text, _, result = grafana.query_range(ann["expr"])
    assert result, f"no collapse page during the lab run:\n{text}"
    collapsed = lab.phases["collapsed"]
    fired = [float(t) for s in result for t, _ in s["values"]]
    assert {s["metric"]["device"] for s in result} & {lab.upper, lab.lower}
    assert collapsed[0] <= min(fired) <= collapsed[1] + 30, "the page fired outside the collapsed phase"


def test_lineup_shows_healthy_and_collapsed(grafana, lab):
    """The lineup panel tells the phases apart: lower follows upper when healthy, drops to 8 sectors collapsed."""
    panel = next(p for p in DASHBOARD["panels"] if p["title"].startswith("Average request size per layer"))
    _, _, result = grafana.query_range(panel["targets"][0]["expr"], panel.get("maxDataPoints"))

    def mean(device, phase, settle=22):  # skip the recording rules' 20 s window at the phase start
        a, b = lab.phases[phase]
        (series,) = [s for s in result if s["metric"]["device"] == device and s["metric"]["operation"] == "read"]
        values = [float(v) for t, v in series["values"] if a + settle <= float(t) <= b]
        assert values, (device, phase)
        return sum(values) / len(values)

    assert mean(lab.upper, "healthy", settle=10) >= 128
    assert mean(lab.lower, "healthy", settle=10) >= 128
    assert mean(lab.upper, "collapsed") >= 128
    assert mean(lab.lower, "collapsed") <= blockstack_dashboard.CONFIG["collapse_max_sectors"]
