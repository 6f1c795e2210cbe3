"""blockstack-doctor on the fixture trees: golden output (doctor-output.txt, rewritten with
`make update-fixtures`), its exit status, and the one table of checks seen three ways: the
doctor, the exporter's blockstack_finding and the alerts (promtool evaluates each settings
alert's own expression on the exporter's scrape of the same tree) name the same devices."""
import difflib
import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import doctor_trees
from blockstack_rules import knobs as deploy_knobs
from blockstack_exporter import checks, knobs
from blockstack_exporter.doctor import parse_diskstats, parse_lvm_conf
from exporter_testlib import HERE, registry_for, tree_flags

DOCTOR = os.path.join(os.path.dirname(sys.executable), "blockstack-doctor")
GOLDEN = os.path.join(HERE, "doctor-output.txt")
NO_LVM_CONF = "/nonexistent/lvm.conf"  # LVM's defaults: autoextend off


def doctor(tree, dm_fixtures, *flags):
    """(exit status, stdout) of the real command on a tree."""
    env = dict(os.environ, FAKE_DMSETUP_FIXTURES=dm_fixtures or "")
    r = subprocess.run([DOCTOR, *tree_flags(tree), f"--path.lvmconf={NO_LVM_CONF}", *flags],
                       capture_output=True, text=True, env=env, timeout=60)
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
        parts.append(f"## blockstack-doctor on fixture {name}: exit {status}\n\n{out.replace(tree, '<tree>')}\n")
    body = "".join(parts)
    if request.config.getoption("--update-golden"):
        with open(GOLDEN, "w") as f:
            f.write(body)
    with open(GOLDEN) as f:
        expected = f.read()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), body.splitlines(True), "doctor-output.txt", "run"))
    assert not diff, "doctor output differs from the golden file (make update-fixtures if intended):\n" + diff


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
    assert "ATTR{queue/nomerges}=\"0\"" in f["persist"] and "lvm-snapshot-nvme-merges.md" in f["why"]
    assert any("nomerges = 2" in e for e in f["evidence"])

    status, report = findings(*trees["snapshot-states"])
    assert status == 1
    assert {f["device"] for f in report["findings"] if f["severity"] == "critical"} == {"dm-3", "dm-5"}
    assert ("snapshot_invalid", "dm-8", "warning") in {(f["check"], f["device"], f["severity"])
                                                       for f in report["findings"]}  # merge failed


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
    env = dict(os.environ, FAKE_DMSETUP_FIXTURES=trees["nvme-incident"][1], FAKE_DMSETUP_MODE="fail")
    r = subprocess.run([DOCTOR, *tree_flags(trees["nvme-incident"][0]), f"--path.lvmconf={NO_LVM_CONF}"],
                       capture_output=True, text=True, env=env, timeout=60)
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
        published = {(s.labels["device"], s.labels["check"], s.labels["severity"])
                     for f in text_string_to_metric_families(text) if f.name == "blockstack_finding"
                     for s in f.samples}
        _, report = findings(tree, dm)
        doctors = {(f["device"], f["check"], f["severity"]) for f in report["findings"]
                   if checks.BY_ID[f["check"]].needs == "scrape"}
        assert published == doctors, name


def _series(text):
    """Every sample of an exposition as a promtool input series of the blockstack job."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {**s.labels, "job": "blockstack", "host": "h"}
            body = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))  # Go's escapes
            out.append({"series": f"{s.name}{{{body}}}", "values": f"{s.value:g}x30"})
    return out


# alert -> (check, severity of the check's findings it fires for: None for all)
ALERTS = {"BlockStackNomergesBeneathStack": ("nomerges_beneath_stack", None),
          "BlockStackMaxSectorsLow": ("max_sectors_low", None),
          "BlockStackSnapshotChunkSmall": ("snapshot_chunk_small", None),
          "BlockStackSnapshotInvalid": ("snapshot_invalid", "critical")}


def test_settings_alerts_and_doctor_agree(trees, tmp_path):
    """Each settings alert's expression (and the snapshot-invalid page's), evaluated by promtool on the exporter's scrape of a tree
    (every device taking 10 writes/s, so the chunk alert's origin condition holds), fires for
    exactly the devices the doctor names for its check."""
    k = deploy_knobs.load()
    rules = deploy_knobs.rule_files(k)
    groups = yaml.safe_load(rules[deploy_knobs.REPO / "alerts/alerts.rules.yml"])["groups"]
    exprs = {r["alert"]: r["expr"] for g in groups for r in g["rules"] if r.get("alert") in ALERTS}
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
        devices = {low for s in series if s["series"].startswith("blockstack_device_info")
                   for low in re.findall(r'device="([^"]+)"', s["series"])}
        series += [{"series": f'node_disk_writes_completed_total{{job="node",host="h",device="{d}"}}',
                    "values": "0+50x30"} for d in sorted(devices)]
        cases = []
        for alert, (check, severity) in ALERTS.items():
            expected = sorted({f["device"] for f in report["findings"]
                               if f["check"] == check and severity in (None, f["severity"])})
            cases.append({"expr": f"group by (device) ({exprs[alert]})", "eval_time": "2m",
                          "exp_samples": [{"labels": f'{{device="{d}"}}', "value": 1} for d in expected]})
        tests.append({"name": f"{name}: the settings alerts name the doctor's devices", "interval": "5s",
                      "input_series": series, "promql_expr_test": cases})
    path = tmp_path / "agree.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [str(recording)], "evaluation_interval": "5s", "tests": tests}))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
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
    r = subprocess.run([DOCTOR, *tree_flags(trees["nvme-incident"][0]), f"--config.knobs={path}"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "--config.knobs" in r.stderr


def test_lvm_conf_and_diskstats_parsers():
    assert parse_lvm_conf("activation {\n  # snapshot_autoextend_threshold = 100\n"
                          "  snapshot_autoextend_threshold = 70\n  thin_pool_autoextend_threshold=80\n}\n") == \
        {"snapshot_autoextend_threshold": 70, "thin_pool_autoextend_threshold": 80}
    stats = parse_diskstats(" 259 0 nvme1n1 3000 2 24000 100 10 0 80 5 0 100 105 0 0 0 0\n 7 0 loop0 bad\n")
    assert stats == {"nvme1n1": (3000, 2, 24000, 10, 0, 80)}


def test_findings_collector_reads_no_file(trees, monkeypatch):
    """The findings cost no second walk: with the scrape's families in hand it opens nothing."""
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
    assert {(f.device, f.check) for f in findings_collector.last} >= {("nvme1n1", "nomerges_beneath_stack")}
