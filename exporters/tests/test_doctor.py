"""blockstack-doctor on the fixture trees: golden output (doctor-output.txt, rewritten with
`make update-fixtures`), its exit status, and the one table of checks seen three ways: the
doctor, the exporter's blockstack_finding and the alerts (promtool evaluates each settings
alert's own expression on the exporter's scrape of the same tree) name the same devices."""

import json
import logging
import os
import re
import subprocess
import sys

import doctor_trees
import pytest
import yaml
from exporter_testlib import HERE, assert_golden, registry_for, tree_flags
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from blockstack_exporter import checks, knobs
from blockstack_exporter.sampling import parse_diskstats, parse_lvm_conf
from blockstack_rules import knobs as deploy_knobs

DOCTOR = os.path.join(os.path.dirname(sys.executable), "blockstack-doctor")
GOLDEN = os.path.join(HERE, "doctor-output.txt")
NO_LVM_CONF = "/nonexistent/lvm.conf"  # LVM's defaults: autoextend off


def doctor(tree, dm_fixtures, *flags):
    """(exit status, stdout) of the real command on a tree."""
    env = dict(os.environ, FAKE_DMSETUP_FIXTURES=dm_fixtures or "")
    r = subprocess.run(
        [
            DOCTOR,
            *tree_flags(tree),
            f"--path.lvmconf={NO_LVM_CONF}",
            f"--path.rootfs={tree}",
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert not r.stderr, r.stderr
    return r.returncode, r.stdout


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("doctor-trees"))
    return {name: doctor_trees.build(base, name) for name in doctor_trees.TREES}


def test_golden_output(trees, request):
    parts = []
    for name, (tree, dm) in trees.items():
        status, out = doctor(tree, dm)
        parts.append(
            f"## blockstack-doctor on fixture {name}: exit {status}\n\n{out.replace(tree, '<tree>')}\n"
        )
    assert_golden(request, GOLDEN, "".join(parts), "doctor output")


def findings(tree, dm, *flags):
    status, out = doctor(tree, dm, "--json", *flags)
    return status, json.loads(out)


def test_exit_status_and_what_it_names(trees):
    status, report = findings(*trees["nvme-incident"])
    assert status == 1
    named = {(f["check"], f["device"], f["severity"]) for f in report["findings"]}
    assert ("nomerges_beneath_stack", "nvme1n1", "warning") in named
    assert ("snapshot_chunk_small", "dm-3", "info") in named
    f = next(f for f in report["findings"] if f["check"] == "nomerges_beneath_stack")
    assert f["fix"] == "echo 0 > /sys/block/nvme1n1/queue/nomerges"
    assert (
        'ATTR{queue/nomerges}="0"' in f["recipes"][0]["content"]
        and "lvm-snapshot-nvme-merges.md" in f["why"]
    )
    assert f["persist"].startswith(
        "/etc/udev/rules.d/90-blockstack-nvme1n1-nomerges.rules, matched by the NVMe"
    )
    assert any("nomerges = 2" in e for e in f["evidence"])

    status, report = findings(*trees["snapshot-states"])
    assert status == 1
    assert {f["device"] for f in report["findings"] if f["severity"] == "critical"} == {
        "dm-3",
        "dm-5",
    }
    assert ("snapshot_invalid", "dm-8", "warning") in {
        (f["check"], f["device"], f["severity"]) for f in report["findings"]
    }  # merge failed


def test_device_narrows_to_its_stacks(trees):
    status, report = findings(*trees["nvme-incident"], "--device", "secvol/tmp_backup1")
    assert status == 1
    assert [s["top"] for s in report["stacks"]] == ["dm-3"]
    assert {f["device"] for f in report["findings"]} == {"nvme1n1", "dm-3"}
    status, report = findings(*trees["nvme-incident"], "--device", "/dev/mapper/secvol-seclv")
    assert [s["top"] for s in report["stacks"]] == ["dm-0"]
    assert {f["check"] for f in report["findings"]} == {"nomerges_beneath_stack"}


def test_exit_2_when_it_cannot_read(trees, tmp_path):
    status, report = findings(*trees["nvme-incident"], "--device", "sdz")
    assert status == 2 and "--device sdz: no such block device" in report["problems"]
    status, out = doctor(str(tmp_path), None)  # no sysfs at all
    assert status == 2 and "no block devices" in out
    env = dict(
        os.environ, FAKE_DMSETUP_FIXTURES=trees["nvme-incident"][1], FAKE_DMSETUP_MODE="fail"
    )
    r = subprocess.run(
        [DOCTOR, *tree_flags(trees["nvme-incident"][0]), f"--path.lvmconf={NO_LVM_CONF}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2 and "collector(s) dm failed as a whole" in r.stdout
    assert "nomerges_beneath_stack" in r.stdout  # what it could read is still judged


def test_healthy_tree_exits_0(tmp_path):
    """The incident's tree with nomerges=0 and 256 KiB chunks: nothing at warning or above."""
    root, dm = doctor_trees.build(str(tmp_path), "nvme-incident")
    with open(os.path.join(root, "sys/class/block/nvme1n1/queue/nomerges"), "w") as f:
        f.write("0\n")
    fixtures = tmp_path / "dm"
    fixtures.mkdir()
    for name in os.listdir(dm):
        with open(os.path.join(dm, name)) as src:
            (fixtures / name).write_text(src.read().replace(" P 8", " P 512"))
    status, report = findings(root, str(fixtures))
    assert status == 0, report["findings"]
    assert {f["check"] for f in report["findings"]} == {"lvm_autoextend_off"}  # info


def test_exporter_publishes_the_doctors_findings(trees):
    """blockstack_finding{device, check, severity} is the doctor's findings of the checks a scrape
    can make (all but lvm.conf's and the interval's), tree by tree."""
    for name, (tree, dm) in trees.items():
        os.environ["FAKE_DMSETUP_FIXTURES"] = dm or ""
        try:
            text = generate_latest(registry_for(tree)).decode()
        finally:
            del os.environ["FAKE_DMSETUP_FIXTURES"]
        published = {
            (s.labels["device"], s.labels["check"], s.labels["severity"])
            for f in text_string_to_metric_families(text)
            if f.name == "blockstack_finding"
            for s in f.samples
        }
        _, report = findings(tree, dm)
        doctors = {
            (f["device"], f["check"], f["severity"])
            for f in report["findings"]
            if checks.BY_ID[f["check"]].needs == "scrape"
        }
        assert published == doctors, name


def _series(text):
    """Every sample of an exposition as a promtool input series of the blockstack job."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {**s.labels, "job": "blockstack", "host": "h"}
            body = ",".join(
                f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())
            )  # Go's escapes
            out.append({"series": f"{s.name}{{{body}}}", "values": f"{s.value:g}x30"})
    return out


# alert -> (check, severity of the check's findings it fires for: None for all)
ALERTS = {
    "BlockStackNomergesBeneathStack": ("nomerges_beneath_stack", None),
    "BlockStackMaxSectorsLow": ("max_sectors_low", None),
    "BlockStackSnapshotChunkSmall": ("snapshot_chunk_small", None),
    "BlockStackSnapshotInvalid": ("snapshot_invalid", "critical"),
}


def test_settings_alerts_and_doctor_agree(trees, tmp_path):
    """Each settings alert's expression (and the snapshot-invalid page's), evaluated by promtool on the exporter's scrape of a tree
    (every device taking 10 writes/s, so the chunk alert's origin condition holds), fires for
    exactly the devices the doctor names for its check, at the severity the doctor gives them."""
    k = deploy_knobs.load()
    rules = deploy_knobs.rule_files(k)
    groups = yaml.safe_load(rules[deploy_knobs.REPO / "alerts/alerts.rules.yml"])["groups"]
    exprs = {r["alert"]: r["expr"] for g in groups for r in g["rules"] if r.get("alert") in ALERTS}
    severities = {
        r["alert"]: r["labels"]["severity"]
        for g in groups
        for r in g["rules"]
        if r.get("alert") in ALERTS
    }
    recording = tmp_path / "recording.rules.yml"
    recording.write_text(rules[deploy_knobs.REPO / "alerts/recording.rules.yml"])
    tests = []
    for name, (tree, dm) in trees.items():
        os.environ["FAKE_DMSETUP_FIXTURES"] = dm or ""
        try:
            text = generate_latest(registry_for(tree)).decode()
        finally:
            del os.environ["FAKE_DMSETUP_FIXTURES"]
        _, report = findings(tree, dm)
        series = _series(text)
        devices = {
            low
            for s in series
            if s["series"].startswith("blockstack_device_info")
            for low in re.findall(r'device="([^"]+)"', s["series"])
        }
        series += [
            {
                "series": f'node_disk_writes_completed_total{{job="node",host="h",device="{d}"}}',
                "values": "0+50x30",
            }
            for d in sorted(devices)
        ]
        cases = []
        for alert, (check, severity) in ALERTS.items():
            expected = sorted(
                {
                    f["device"]
                    for f in report["findings"]
                    if f["check"] == check and severity in (None, f["severity"])
                }
            )
            # and with the alert's severity: a setting the doctor calls info never warns, and so on
            assert {
                f["severity"]
                for f in report["findings"]
                if f["check"] == check and f["device"] in expected
            } <= {severities[alert]}, (name, alert)
            cases.append(
                {
                    "expr": f"group by (device) ({exprs[alert]})",
                    "eval_time": "2m",
                    "exp_samples": [{"labels": f'{{device="{d}"}}', "value": 1} for d in expected],
                }
            )
        tests.append(
            {
                "name": f"{name}: the settings alerts name the doctor's devices",
                "interval": "5s",
                "input_series": series,
                "promql_expr_test": cases,
            }
        )
    path = tmp_path / "agree.test.yml"
    path.write_text(
        yaml.safe_dump(
            {"rule_files": [str(recording)], "evaluation_interval": "5s", "tests": tests}
        )
    )
    r = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_knobs_shipped_are_the_alerts_knobs():
    """The package's config.yml is alerts/config.yml (a link the build copies), and every knob the
    checks read is in it with the rules' value."""
    assert os.path.samefile(knobs.SHIPPED, deploy_knobs.CONFIG)
    shipped, rules = knobs.load(required=checks.KNOBS), deploy_knobs.load()
    assert {k: shipped[k] for k in checks.KNOBS} == {k: rules[k] for k in checks.KNOBS}


def test_knobs_flag_changes_the_threshold(trees, tmp_path):
    """--config.knobs: an operator's config.yml; a bad one is exit 2 with its reason."""
    config = yaml.safe_load(open(knobs.SHIPPED))
    config["snapshot_chunk_min_bytes"] = 4096  # 4 KiB chunks no longer small
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    _, report = findings(*trees["nvme-incident"], f"--config.knobs={path}")
    assert "snapshot_chunk_small" not in {f["check"] for f in report["findings"]}
    path.write_text("snapshot_chunk_min_bytes: [1\n")
    env = dict(os.environ, FAKE_DMSETUP_FIXTURES=trees["nvme-incident"][1])
    r = subprocess.run(
        [DOCTOR, *tree_flags(trees["nvme-incident"][0]), f"--config.knobs={path}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2 and "--config.knobs" in r.stderr


def test_lvm_conf_and_diskstats_parsers():
    assert parse_lvm_conf(
        "activation {\n  # snapshot_autoextend_threshold = 100\n"
        "  snapshot_autoextend_threshold = 70\n  thin_pool_autoextend_threshold=80\n}\n"
    ) == {"snapshot_autoextend_threshold": 70, "thin_pool_autoextend_threshold": 80}
    stats = parse_diskstats(
        " 259 0 nvme1n1 3000 2 24000 100 10 0 80 5 0 100 105 0 0 0 0\n 7 0 loop0 bad\n"
    )
    assert stats == {"nvme1n1": (3000, 2, 24000, 10, 0, 80)}


def test_the_host_holds_what_the_families_publish(trees, monkeypatch):
    """The checks judge the values the collectors hand over (checks.Host), the metrics are built
    from the same values: on every fixture tree, each queue setting, device, edge, device number,
    dm target, snapshot and thin-pool figure, ext4 journal and jbd2 transaction count of the Host
    is the sample of the one series that publishes it, and the other way round."""
    from blockstack_exporter.scrape import BlockstackCollector
    from blockstack_exporter.settings import SETTINGS

    by_metric = {s.name: s.file for s in SETTINGS}
    snap = {"chunk_size": "chunk", "cow_used": "used", "cow_size": "size"}
    pool = {f"{w}_{k}": f"{w[:4]}_{k}" for w in ("data", "metadata") for k in ("used", "size")}
    for name, (tree, dm) in trees.items():
        monkeypatch.setenv("FAKE_DMSETUP_FIXTURES", dm or "")
        registry = registry_for(tree)
        collector = next(
            c for c in registry._collector_to_names if isinstance(c, BlockstackCollector)
        )
        published = {}
        for family in registry.collect():
            for x in family.samples:
                d, metric = x.labels.get("device"), x.name.removeprefix("blockstack_")
                if x.name in by_metric:
                    published[("queue", d, by_metric[x.name])] = x.value
                elif metric == "queue_scheduler_info":
                    published[("queue", d, "scheduler")] = x.labels["scheduler"]
                elif metric == "device_info":
                    published[("device", d)] = {k: v for k, v in x.labels.items() if k != "device"}
                elif metric == "device_number_info":
                    published[("number", d)] = (x.labels["major_minor"], x.labels["devno"])
                elif metric == "device_lower_info":
                    published[("lower", d, x.labels["lower"])] = 1
                elif metric == "dm_target_info":
                    published[("target", d, x.labels["target"])] = 1
                elif metric.removeprefix("dm_snapshot_").removesuffix("_bytes") in snap:
                    key = snap[metric.removeprefix("dm_snapshot_").removesuffix("_bytes")]
                    published[("snapshot", d, key)] = x.value
                elif metric.removeprefix("dm_thin_pool_").removesuffix("_bytes") in pool:
                    key = pool[metric.removeprefix("dm_thin_pool_").removesuffix("_bytes")]
                    published[("pool", d, key)] = x.value
                elif metric in ("dm_snapshot_state", "dm_thin_pool_state") and x.value == 1:
                    part = "snapshot" if "snapshot" in metric else "pool"
                    published[(part, d, "state")] = x.labels["state"]
                elif metric == "ext4_journal_size_bytes":
                    published[("ext4", d, "journal")] = x.value
                elif metric == "jbd2_transactions_total":
                    published[("jbd2", d, "transactions")] = x.value
        host = collector.collectors[-1].host
        held = {("queue", d, k): v for d, q in host.queue.items() for k, v in q.items()}
        held.update({("device", d): info for d, info in host.devices.items()})
        held.update({("lower", d, low): 1 for d, lows in host.lower.items() for low in lows})
        held.update({("number", d): numbers for d, numbers in host.numbers.items()})
        held.update({("target", d, t): 1 for d, ts in host.targets.items() for t in ts})
        for part, values in (("snapshot", host.snapshots), ("pool", host.pools)):
            held.update(
                {
                    (part, d, k): v
                    for d, fields in values.items()
                    for k, v in fields.items()
                    if k in (*snap.values(), *pool.values(), "state")
                }
            )
        held.update(
            {("ext4", d, "journal"): f["journal"] for d, f in host.ext4.items() if "journal" in f}
        )
        held.update({("jbd2", d, "transactions"): j["transactions"] for d, j in host.jbd2.items()})
        assert held == published, name
        assert any(k[0] == "queue" for k in held), name


def test_findings_collector_reads_no_file(trees, monkeypatch):
    """The findings cost no second walk: with the scrape's Host in hand it opens nothing."""
    from blockstack_exporter.collectors import findings as findings_module
    from blockstack_exporter.scrape import BlockstackCollector

    tree, dm = trees["nvme-incident"]
    monkeypatch.setenv("FAKE_DMSETUP_FIXTURES", dm)
    registry = registry_for(tree)
    collector = next(c for c in registry._collector_to_names if isinstance(c, BlockstackCollector))
    findings_collector = collector.collectors[-1]
    assert isinstance(findings_collector, findings_module.FindingsCollector)
    opened = []
    real_collect = findings_collector.collect

    def watched(scrape):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(os, "open", lambda *a, **kw: opened.append(a[0]))
            mp.setattr("builtins.open", lambda *a, **kw: opened.append(a[0]))
            return real_collect(scrape)

    findings_collector.collect = watched
    list(registry.collect())
    assert opened == []
    assert {(f.device, f.check) for f in findings_collector.last} >= {
        ("nvme1n1", "nomerges_beneath_stack")
    }


# --- --interval's merge_collapse against the collapse rules ---------------------------------------

# name -> (devices {name: kind}, edges {upper: [lowers]}, diskstats {device: (reads/s, sectors each)},
#          eBPF {device: (requests issued/s, sectors each, refused merges/s, split pieces/s)} or None,
#          what the doctor must say {device: severity}[, max_sectors_kb {device: KiB}])
# A warning is neither the page's evidence nor the layered rule's: the promtool half expects
# neither to hold there.
# The NVMe write-up's stack and iostat lineup: dm-3 at 512 sectors over dm-1 and nvme1n1 at 8
NVME = (
    {"dm-3": "dm", "dm-0": "dm", "dm-1": "dm", "nvme1n1": "disk"},
    {"dm-3": ["dm-0", "dm-1"], "dm-0": ["nvme1n1"], "dm-1": ["nvme1n1"]},
    {"dm-3": (47, 512), "dm-1": (3000, 8), "nvme1n1": (3000, 8)},
)
COLLAPSES = {
    "NVMe incident, with eBPF: nvme1n1 refuses merges (dm-3 splits bios but issues no request)": (
        *NVME,
        {"nvme1n1": (3000, 8, 2800, 0), "dm-3": (0, 0, 0, 2800)},
        {"nvme1n1": "critical"},
    ),
    "NVMe incident's lineup without eBPF: the layered shape only": (
        *NVME,
        None,
        {"nvme1n1": "info"},
    ),
    "the layered shape with eBPF counting nothing refused or split on vda (a shared disk)": (
        {"dm-0": "dm", "vda": "disk"},
        {"dm-0": ["vda"]},
        {"dm-0": (47, 512), "vda": (3000, 8)},
        {"vda": (3000, 8, 0, 0)},
        {"vda": "info"},
    ),
    "loop lab, max_sectors_kb=4: loop0's requests are pieces split off loop1's": (
        {"loop1": "loop", "loop0": "loop"},
        {"loop1": ["loop0"]},
        {"loop1": (100, 1024), "loop0": (12800, 8)},
        {"loop0": (12800, 8, 0, 12700)},
        {"loop0": "critical"},
    ),
    "1 MiB bios split into 128 KiB pieces: how large I/O is issued, no collapse": (
        {"dm-0": "dm", "sda": "disk"},
        {"dm-0": ["sda"]},
        {"dm-0": (100, 2048), "sda": (800, 256)},
        {"sda": (800, 256, 0, 700)},
        {},
    ),
    "refused merges over the requests issued (eBPF), not diskstats' completions": (
        {"sdb": "disk"},
        {},
        {"sdb": (3500, 8)},
        {"sdb": (3000, 8, 1600, 0)},
        {"sdb": "critical"},
    ),
    # the page's "split into tiny pieces" as blockstack-doctor --interval sees it without eBPF:
    # the max_sectors_kb=4 under 1 MiB direct reads, the device alone (nothing above it,
    # so not even the layered shape): requests at the limit, a warning (exit 1), not nothing
    "loop0 alone at max_sectors_kb=4 under 1 MiB direct reads, without eBPF: requests cut at the limit": (
        {"loop0": "loop"},
        {},
        {"loop0": (12800, 8)},
        None,
        {"loop0": "warning"},
        {"loop0": 4},
    ),
    "random 4 KiB reads at max_sectors_kb=128, without eBPF: far under the limit": (
        {"loop0": "loop"},
        {},
        {"loop0": (12800, 8)},
        None,
        {},
        {"loop0": 128},
    ),
    "random 4 KiB reads at max_sectors_kb=4 with eBPF counting no piece: the counters decide": (
        {"loop0": "loop"},
        {},
        {"loop0": (12800, 8)},
        {"loop0": (12800, 8, 0, 0)},
        {},
        {"loop0": 4},
    ),
    "a trickle of refused merges": (
        {"dm-0": "dm", "nvme0n1": "disk"},
        {"dm-0": ["nvme0n1"]},
        {"dm-0": (1, 512), "nvme0n1": (60, 8)},
        {"nvme0n1": (60, 8, 60, 0)},
        {},
    ),
}


def _collapse_case(devices, edges, disk, ebpf, max_sectors_kb=None):
    """The doctor's merge_collapse findings on one interval of 10 s, and the promtool series of
    the same counters (5 s scrapes)."""
    from blockstack_exporter.collapse import INTERVAL_KNOBS, collapse_findings
    from blockstack_exporter.lineup import Sample, lineup
    from blockstack_exporter.settings import MAX_HW_SECTORS_KB, MAX_SECTORS_KB

    h = checks.Host()
    for name, kind in devices.items():
        h.devices[name] = {"kind": kind, "name": name}
        h.lower[name] = list(edges.get(name, []))
    for name, kib in (max_sectors_kb or {}).items():
        h.queue[name] = {MAX_SECTORS_KB.file: kib * 1024, MAX_HW_SECTORS_KB.file: 32767 * 1024}
    zero = {d: (0,) * 6 for d in devices}
    after = {d: (rps * 10, 0, rps * 10 * size, 0, 0, 0) for d, (rps, size) in disk.items()}
    counters = (
        None
        if ebpf is None
        else {
            (what, d, "read"): v * 10
            for d, (rq, size, missed, splits) in ebpf.items()
            for what, v in (
                ("issued", rq),
                ("issued_bytes", rq * size * 512),
                ("missed_merges", missed),
                ("splits", splits),
            )
        }
    )
    rows = lineup(
        Sample(h, {}, [], zero, None if ebpf is None else {}, 0.0),
        Sample(h, {}, [], {**zero, **after}, counters, 10.0),
        10.0,
    )
    found = {
        (f.device, "read"): f.severity
        for f in collapse_findings(h, rows, knobs.load(required=INTERVAL_KNOBS))
    }

    def counter(name, labels, per_second):
        body = ",".join(f'{k}="{v}"' for k, v in {"host": "h", **labels}.items())
        return {"series": f"{name}{{{body}}}", "values": f"0+{per_second * 5:g}x60"}

    series = []
    for i, (name, kind) in enumerate(sorted(devices.items())):
        series += [
            {
                "series": f'blockstack_device_info{{job="blockstack",host="h",device="{name}",kind="{kind}"}}',
                "values": "1x60",
            },
            {
                "series": f'blockstack_device_number_info{{job="blockstack",host="h",device="{name}",'
                f'major_minor="8:{i}",devno="{2048 + i}"}}',
                "values": "1x60",
            },
        ]
        series += [
            {
                "series": f'blockstack_device_lower_info{{job="blockstack",host="h",device="{name}",'
                f'lower="{low}"}}',
                "values": "1x60",
            }
            for low in edges.get(name, [])
        ]
        series += [
            {
                "series": f'blockstack_device_beneath_info{{job="blockstack",host="h",device="{name}",'
                f'lower="{low}",depth="{depth}"}}',
                "values": "1x60",
            }
            for depth, layer in enumerate(h.layers(name))
            if depth
            for low in layer
        ]
        if name in disk:
            rps, size = disk[name]
            node = {"job": "node", "device": name}
            series += [
                counter("node_disk_reads_completed_total", node, rps),
                counter("node_disk_read_bytes_total", node, rps * size * 512),
            ]
        if ebpf and name in ebpf:
            rq, size, missed, splits = ebpf[name]
            e = {"job": "ebpf", "devno": str(2048 + i), "operation": "read"}
            series += [
                counter("ebpf_exporter_block_rq_size_bytes_count", e, rq),
                counter("ebpf_exporter_block_rq_size_bytes_sum", e, rq * size * 512),
                counter("ebpf_exporter_block_rq_missed_merges_total", e, missed),
                counter("ebpf_exporter_block_bio_splits_total", e, splits),
            ]
    return found, series


def test_interval_collapse_and_the_collapse_rules_agree(tmp_path):
    """--interval's merge_collapse is critical exactly where BlockStackMergeCollapse's expression
    holds on the same counters (evidence counted by eBPF on the device's own requests), and info
    exactly where only the layered recording rule (the dashboard's context) holds."""
    k = deploy_knobs.load()
    rules = deploy_knobs.rule_files(k)
    groups = yaml.safe_load(rules[deploy_knobs.REPO / "alerts/alerts.rules.yml"])["groups"]
    page = next(
        r["expr"] for g in groups for r in g["rules"] if r.get("alert") == "BlockStackMergeCollapse"
    )
    recording = tmp_path / "recording.rules.yml"
    recording.write_text(rules[deploy_knobs.REPO / "alerts/recording.rules.yml"])
    tests = []
    for name, (devices, edges, disk, ebpf, expected, *queue) in COLLAPSES.items():
        found, series = _collapse_case(devices, edges, disk, ebpf, *queue)
        assert found == {(d, "read"): s for d, s in expected.items()}, name

        def samples(severity):
            return [
                {"labels": f'{{device="{d}",operation="{op}"}}', "value": 1}
                for (d, op), s in sorted(found.items())
                if s == severity
            ]

        tests.append(
            {
                "name": name,
                "interval": "5s",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": f"group by (device, operation) ({page})",
                        "eval_time": "2m",
                        "exp_samples": samples("critical"),
                    },
                    {
                        "expr": "group by (device, operation) (host_device_operation:blockstack_collapse_layered:split_ratio "
                        f"unless on (host, device, operation) ({page}))",
                        "eval_time": "2m",
                        "exp_samples": samples("info"),
                    },
                ],
            }
        )
    path = tmp_path / "collapse.test.yml"
    path.write_text(
        yaml.safe_dump(
            {"rule_files": [str(recording)], "evaluation_interval": "5s", "tests": tests}
        )
    )
    r = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _reads_during_the_interval(monkeypatch, diskstats, device, per_second, sectors):
    """The kernel's counting while the doctor waits out --interval: each wait adds reads of
    `sectors` to the device's line of the tree's diskstats, per_second of them, then waits."""
    from blockstack_exporter import doctor as doctor_module

    real_sleep = doctor_module.time.sleep

    def io_while_waiting(seconds):
        lines = []
        for line in open(diskstats).read().splitlines():
            f = line.split()
            if f[2] == device:
                reads = round(per_second * seconds)
                f[3] = str(int(f[3]) + reads)
                f[5] = str(int(f[5]) + reads * sectors)
            lines.append(" ".join(f))
        with open(diskstats, "w") as out:
            out.write("\n".join(lines) + "\n")
        real_sleep(seconds)

    monkeypatch.setattr(doctor_module.time, "sleep", io_while_waiting)


@pytest.mark.parametrize("reading", [True, False], ids=["split-collapse", "idle"])
def test_the_doctor_the_page_names_sees_a_split_collapse_without_ebpf(
    tmp_path, monkeypatch, reading
):
    """The issue's case: max_sectors_kb=4 under 1 MiB direct reads paged "split into tiny
    pieces" while the doctor said info and exit 0. Run as the page says (--device DEV
    --interval 5, here 1 s), with no ebpf_exporter: while the device serves 8-sector requests
    at 12800/s, each at its 4 KiB limit, merge_collapse names the split at warning and the doctor
    exits 1; idle, the same tree has no collapse and exits 0."""
    import io
    import shutil

    from blockstack_exporter import doctor as doctor_module

    tree = str(tmp_path / "host-loop")
    shutil.copytree(doctor_trees.build(str(tmp_path), "host-loop")[0], tree, symlinks=True)
    # loop0 alone at fault: nomerges back to 0 (its own warning would make exit 1 anyway)
    with open(os.path.join(tree, "sys/class/block/loop0/queue/nomerges"), "w") as f:
        f.write("0\n")
    if reading:
        _reads_during_the_interval(
            monkeypatch, os.path.join(tree, "proc/diskstats"), "loop0", 12800, 8
        )
    # run in this process: the doctor takes over the exporter's logger (its own handler, no
    # propagation), which the tests after this one in the same worker must get back
    log = logging.getLogger("blockstack_exporter")
    monkeypatch.setattr(log, "propagate", log.propagate)
    monkeypatch.setattr(log, "handlers", list(log.handlers))
    out = io.StringIO()
    args = doctor_module.parse_args(
        [
            *tree_flags(tree),
            f"--path.lvmconf={NO_LVM_CONF}",
            f"--path.rootfs={tree}",
            "--json",
            "--device=loop0",
            "--interval=1",
        ]
    )
    status = doctor_module.run(args, out=out)
    report = json.loads(out.getvalue())
    collapse = [f for f in report["findings"] if f["check"] == "merge_collapse"]
    if not reading:
        assert status == 0 and not collapse, report["findings"]
        return
    assert status == 1, report["findings"]
    (f,) = collapse
    assert f["device"] == "loop0" and f["severity"] == "warning", f
    assert f["what"].startswith("requests split (diskstats): loop0 reads 8-sector requests at"), f
    assert "max_sectors_kb=4" in f["what"], f
    assert f["fix"] == "echo 1280 > /sys/block/loop0/queue/max_sectors_kb", f


# --- whose I/O: the cgroups a collapse splits -----------------------------------------------------

DOCKER = "docker-" + "0123456789abcdef" * 4 + ".scope"
# ebpf_exporter's block_io per cgroup (ebpf-configs/block_cgroups.bpf.h) in the format it serves:
# {metric: [(labels, per second)]}; loop0 (devno 1792) serves the pieces split off loop1's
# requests (the loop lab at max_sectors_kb=4), for a database, a container and the rest ("other").
EBPF_PER_SECOND = {
    "ebpf_exporter_block_rq_size_bytes_count": [('devno="1792",operation="read"', 12800)],
    "ebpf_exporter_block_rq_size_bytes_sum": [('devno="1792",operation="read"', 12800 * 4096)],
    "ebpf_exporter_block_bio_splits_total": [('devno="1792",operation="read"', 12700)],
    "ebpf_exporter_block_cgroup_admissions_total": [
        ('cgroup="postgresql.service",cgroup_id="61",devno="1792",parent="system.slice"', 0),
        (f'cgroup="{DOCKER}",cgroup_id="81",devno="1792",parent="system.slice"', 0),
        ('cgroup="other",cgroup_id="0",devno="1792",parent=""', 0),
        ('cgroup="/",cgroup_id="1",devno="65024",parent="/"', 0),  # no device of the host's
    ],
    "ebpf_exporter_block_cgroup_bio_bytes_total": [
        ('cgroup_id="61",devno="1792",operation="read"', 40 << 20),
        ('cgroup_id="81",devno="1792",operation="read"', 9 << 20),
        ('cgroup_id="0",devno="1792",operation="read"', 1 << 20),
        ('cgroup_id="90",devno="1792",operation="read"', 1 << 10),  # admitted while read
        ('cgroup_id="1",devno="65024",operation="read"', 1 << 20),
    ],
    "ebpf_exporter_block_cgroup_splits_total": [
        ('cgroup_id="61",devno="1792",operation="read"', 11684),
        ('cgroup_id="81",devno="1792",operation="read"', 889),
        ('cgroup_id="0",devno="1792",operation="read"', 127),
    ],
}


def _ebpf_text(seconds):
    """The exposition text of EBPF_PER_SECOND's counters after `seconds` (admissions stay 1)."""
    lines = []
    for metric, samples in EBPF_PER_SECOND.items():
        kind = "summary" if "_size_bytes_" in metric else "counter"
        lines.append(f"# TYPE {metric.removesuffix('_count').removesuffix('_sum')} {kind}")
        lines += [f"{metric}{{{labels}}} {v * seconds if v else 1}" for labels, v in samples]
    return "\n".join(lines) + "\n"


def test_cgroup_label_shortens_container_scopes_as_the_rules_do():
    from blockstack_exporter.ebpf_counters import cgroup_label

    assert cgroup_label(DOCKER) == "docker 0123456789ab"
    assert cgroup_label("cri-containerd-" + "ab" * 32 + ".scope") == "cri-containerd abababababab"
    assert cgroup_label("libpod-" + "f" * 64 + ".scope") == "libpod ffffffffffff"
    for kept in ("postgresql.service", "docker.service", "docker-0123.scope", "/", "other"):
        assert cgroup_label(kept) == kept


def test_top_cgroups_names_the_three_largest_shares():
    from blockstack_exporter.lineup import top_cgroups

    counts = {"backup.service": 7, "postgresql.service": 92, "other": 0.9, "cron.service": 0.1}
    assert top_cgroups(counts) == "postgresql.service (92%), backup.service (7%), other (1%)"
    assert top_cgroups({"a": 1, "b": 999, "c": 0}, n=5) == "b (100%), a (<1%)"
    assert top_cgroups({"a": 0}) == top_cgroups({}) == ""


def test_parse_ebpf_names_each_cgroup_by_its_admission():
    from blockstack_exporter.ebpf_counters import parse_ebpf

    counters = parse_ebpf(_ebpf_text(10), {"1792": "loop0", "1793": "loop1"})
    per_cgroup = {k: v for k, v in counters.items() if len(k) == 4}
    assert per_cgroup == {
        ("cgroup_bytes", "loop0", "read", "postgresql.service"): 400 << 20,
        ("cgroup_bytes", "loop0", "read", "docker 0123456789ab"): 90 << 20,
        ("cgroup_bytes", "loop0", "read", "other"): 10 << 20,
        ("cgroup_bytes", "loop0", "read", "cgroup id 90"): 10 << 10,
        ("cgroup_collapse", "loop0", "read", "postgresql.service"): 116840,
        ("cgroup_collapse", "loop0", "read", "docker 0123456789ab"): 8890,
        ("cgroup_collapse", "loop0", "read", "other"): 1270,
    }
    assert counters[("splits", "loop0", "read")] == 127000  # the device's own, not summed in


def test_the_collapse_names_whose_io_it_splits():
    """--interval --ebpf: the collapse finding names the cgroups with the most refused merges and
    split-off pieces on the device, with their shares (the page's "Mostly from"), and the lineup
    the cgroups with the most bytes under each device."""
    from blockstack_exporter.collapse import INTERVAL_KNOBS, collapse_findings
    from blockstack_exporter.ebpf_counters import parse_ebpf
    from blockstack_exporter.lineup import Sample, lineup
    from blockstack_exporter.report import _lineup_table

    h = checks.Host()
    for name, lower in (("loop1", ["loop0"]), ("loop0", [])):
        h.devices[name] = {"kind": "loop", "name": name}
        h.lower[name] = lower
    names = {"1792": "loop0", "1793": "loop1"}
    disk = {"loop1": (1000, 0, 1000 * 1024, 0, 0, 0), "loop0": (128000, 0, 128000 * 8, 0, 0, 0)}
    zero = {n: (0,) * 6 for n in disk}
    rows = lineup(
        Sample(h, {}, [], zero, parse_ebpf(_ebpf_text(5), names), 0.0),
        Sample(h, {}, [], disk, parse_ebpf(_ebpf_text(15), names), 10.0),
        10.0,
    )
    assert rows["loop0"]["read"]["cgroups"]["postgresql.service"] == {
        "kbps": 40 * 1024,
        "collapse_ps": 11684,
    }
    (found,) = collapse_findings(h, rows, knobs.load(required=INTERVAL_KNOBS))
    assert (found.device, found.severity) == ("loop0", "critical")
    assert found.what == (
        "requests split: loop0 reads 8-sector requests at 12800/s, mostly from "
        "postgresql.service (92%), docker 0123456789ab (7%), other (1%)"
    )
    table = _lineup_table(h, ["loop1", "loop0"], rows, ebpf=True)
    (loop0,) = [i for i, line in enumerate(table) if line.split()[0] == "loop0"]
    assert table[loop0 + 1].split() == [
        "bytes",
        "from",
        "postgresql.service",
        "(80%),",
        "docker",
        "0123456789ab",
        "(18%),",
        "other",
        "(2%)",
    ]
    # without cgroup counters (an older block_io) the finding and the lineup are as before
    plain = {k: v for k, v in parse_ebpf(_ebpf_text(15), names).items() if len(k) == 3}
    rows = lineup(Sample(h, {}, [], zero, {}, 0.0), Sample(h, {}, [], disk, plain, 1.0), 1.0)
    assert rows["loop0"]["read"]["cgroups"] == {}
    assert [line.split()[0] for line in _lineup_table(h, ["loop0"], rows, ebpf=True)] == [
        "device",
        "loop0",
    ]
