"""The table of checks on hand-made Hosts: each check's edges, at the knobs' values."""

import os

import pytest

from blockstack_exporter import checks, knobs

K = knobs.load(required=checks.KNOBS)
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def host(devices, lower=None, queue=None, **parts):
    """A Host of {name: kind} devices with edges {upper: [lowers]} and queue settings."""
    h = checks.Host()
    for name, kind in devices.items():
        h.devices[name] = {"kind": kind, "name": name}
        h.lower[name] = list((lower or {}).get(name, []))
    h.queue = {name: dict(q) for name, q in (queue or {}).items()}
    for key, value in parts.items():
        setattr(h, key, value)
    return h


def found(h, check=None):
    return {
        (f.check, f.device, f.severity) for f in checks.evaluate(h, K) if check in (None, f.check)
    }


def test_max_sectors_low_at_the_alerts_edges():
    floor = K["max_sectors_floor_bytes"]
    below = host(
        {"sda": "disk"},
        queue={"sda": {"max_sectors_kb": floor - KIB, "max_hw_sectors_kb": 32767 * KIB}},
    )
    at = host(
        {"sda": "disk"}, queue={"sda": {"max_sectors_kb": floor, "max_hw_sectors_kb": 32767 * KIB}}
    )
    # below the floor but not below ratio x hardware: as the alert, nothing
    small_hw = host(
        {"sda": "disk"}, queue={"sda": {"max_sectors_kb": 64 * KIB, "max_hw_sectors_kb": 128 * KIB}}
    )
    assert found(below, "max_sectors_low") == {("max_sectors_low", "sda", "info")}
    assert found(at, "max_sectors_low") == set()
    assert found(small_hw, "max_sectors_low") == set()


def test_max_sectors_below_what_the_dm_device_above_sends():
    q = {
        "dm-0": {"max_sectors_kb": 1280 * KIB, "max_hw_sectors_kb": 32767 * KIB},
        "sda": {"max_sectors_kb": 512 * KIB, "max_hw_sectors_kb": 32767 * KIB},
    }
    h = host({"dm-0": "dm", "sda": "disk"}, {"dm-0": ["sda"]}, q)
    f = [f for f in checks.evaluate(h, K) if f.check == "max_sectors_below_upper"]
    assert [(x.device, x.fix) for x in f] == [
        ("sda", "echo 1280 > /sys/block/sda/queue/max_sectors_kb")
    ]
    q["sda"]["max_sectors_kb"] = 1280 * KIB
    assert (
        found(host({"dm-0": "dm", "sda": "disk"}, {"dm-0": ["sda"]}, q), "max_sectors_below_upper")
        == set()
    )


def test_nomerges_beneath_a_partition_names_the_disks_queue():
    h = host(
        {"dm-0": "dm", "sda1": "partition", "sda": "disk"},
        {"dm-0": ["sda1"], "sda1": ["sda"]},
        {"sda1": {"nomerges": 2}, "sda": {"nomerges": 2}},
    )
    f = {x.device: x for x in checks.evaluate(h, K) if x.check == "nomerges_beneath_stack"}
    assert set(f) == {"sda", "sda1"}  # both sit beneath something, as in the alert
    assert f["sda1"].fix == "echo 0 > /sys/block/sda/queue/nomerges"


def test_cow_filling_predicted_full_within_the_horizon_warns():
    size = 1 * GIB
    now = host(
        {"dm-3": "dm"}, snapshots={"dm-3": {"name": "vg-snap", "used": 0.5 * size, "size": size}}
    )
    assert found(now, "snapshot_cow_filling") == {("snapshot_cow_filling", "dm-3", "info")}
    before = host(
        {"dm-3": "dm"},
        snapshots={"dm-3": {"name": "vg-snap", "used": 0.5 * size - 10 * MIB, "size": size}},
    )
    now.previous, now.elapsed = before, 10.0  # 1 MiB/s: 512 MiB left fills in 512 s
    assert found(now, "snapshot_cow_filling") == {("snapshot_cow_filling", "dm-3", "warning")}
    slow = host(
        {"dm-3": "dm"},
        snapshots={"dm-3": {"name": "vg-snap", "used": 0.5 * size - 1024, "size": size}},
    )
    now.previous = slow  # 100 B/s: days
    assert found(now, "snapshot_cow_filling") == {("snapshot_cow_filling", "dm-3", "info")}
    below = host(
        {"dm-3": "dm"}, snapshots={"dm-3": {"name": "s", "used": 0.3 * size, "size": size}}
    )
    assert found(below, "snapshot_cow_filling") == set()


def test_thin_pool_use_and_state():
    pool = {
        "name": "vg-pool-tpool",
        "data_used": 79,
        "data_size": 100,
        "meta_used": 1,
        "meta_size": 100,
        "state": "rw",
    }
    h = host({"dm-6": "dm"}, pools={"dm-6": pool})
    assert found(h, "thin_pool_full") == set()
    pool["data_used"] = 80
    assert found(h, "thin_pool_full") == {("thin_pool_full", "dm-6", "warning")}
    pool["state"] = "out_of_data_space"
    assert found(h, "thin_pool_full") == {("thin_pool_full", "dm-6", "critical")}


def test_ext4_journal_small_warns_on_waits():
    fs = {"mountpoint": "/srv", "options": {"dioread_nolock": ""}, "journal": 128 * MIB}
    jbd2 = {"journal": "sdb-8", "phases": {"waiting": 0.0}, "transactions": 10}
    h = host({"sdb": "disk"}, ext4={"sdb": fs}, jbd2={"sdb": jbd2})
    assert found(h, "ext4_journal_small") == {("ext4_journal_small", "sdb", "info")}
    jbd2["phases"]["waiting"] = 0.154  # the incident's 154 ms
    assert found(h, "ext4_journal_small") == {("ext4_journal_small", "sdb", "warning")}
    fs["options"] = {"nodioread_nolock": ""}
    assert found(h, "ext4_journal_small") == set()
    fs["options"], fs["journal"] = {"dioread_nolock": ""}, 1 * GIB  # the write-up's fix
    assert found(h, "ext4_journal_small") == set()
    fs["options"], fs["journal"] = (
        {"dioread_nolock": "", "nodelalloc": ""},
        128 * MIB,
    )  # the write-up's other fix:
    assert (
        found(h, "ext4_journal_small") == set()
    )  # ext4_should_dioread_nolock() is false without delalloc


def test_ext4_journal_small_with_ebpf_uses_the_alerts_predicate():
    fs = {"mountpoint": "/srv", "options": {"dioread_nolock": ""}, "journal": 128 * MIB}
    h = host({"sdb": "disk"}, ext4={"sdb": fs})
    h.ebpf = {
        ("jbd2_credit_wait", "sdb"): K["jbd2_credit_wait_min_rate"] - 1,
        ("jbd2_credit_wait_avg", "sdb"): 0.154,
        ("jbd2_checkpoint_share", "sdb"): 0.05,
    }
    assert found(h, "ext4_journal_small") == {("ext4_journal_small", "sdb", "info")}  # a trickle
    h.ebpf[("jbd2_credit_wait", "sdb")] = K["jbd2_credit_wait_min_rate"]
    assert found(h, "ext4_journal_small") == {("ext4_journal_small", "sdb", "warning")}
    # long waits, but the journal was never full: CPU or device contention, not its size
    h.ebpf[("jbd2_checkpoint_share", "sdb")] = K["jbd2_checkpoint_wait_min_ratio"] / 10
    assert found(h, "ext4_journal_small") == {("ext4_journal_small", "sdb", "info")}


@pytest.mark.parametrize(
    "rot,sched,expected",
    [(1, "none", True), (1, "mq-deadline", False), (0, "bfq", True), (0, "none", False)],
)
def test_scheduler_against_the_device(rot, sched, expected):
    h = host(
        {"sda": "disk", "loop0": "loop"},
        queue={
            "sda": {"rotational": rot, "scheduler": sched},
            "loop0": {"rotational": rot, "scheduler": sched},
        },
    )
    assert found(h, "scheduler_mismatch") == (
        {("scheduler_mismatch", "sda", "info")} if expected else set()
    )


def test_crypt_on_fast_devices_without_the_flags():
    q = {"nvme0n1": {"rotational": 0}, "sda": {"rotational": 1}}
    h = host(
        {"dm-0": "dm", "nvme0n1": "disk"},
        {"dm-0": ["nvme0n1"]},
        q,
        targets={"dm-0": {"crypt"}},
        crypt_flags={"dm-0": {"allow_discards"}},
    )
    assert found(h, "crypt_workqueue") == {("crypt_workqueue", "dm-0", "info")}
    h.crypt_flags = {"dm-0": {"no_read_workqueue", "no_write_workqueue"}}
    assert found(h, "crypt_workqueue") == set()
    hdd = host({"dm-0": "dm", "sda": "disk"}, {"dm-0": ["sda"]}, q, targets={"dm-0": {"crypt"}})
    assert found(hdd, "crypt_workqueue") == set()


def test_crypt_flags_never_take_the_key():
    from blockstack_exporter.collectors.dm_parse import crypt_flags

    assert crypt_flags(
        "aes-xts-plain64 no_read_workqueue 0 8:19 32768 2 allow_discards no_write_workqueue"
    ) == {"allow_discards", "no_write_workqueue"}


def test_lvm_autoextend_only_with_lvm_conf():
    h = host({"dm-3": "dm"}, snapshots={"dm-3": {"name": "vg-snap", "chunk": 256 * KIB}})
    assert found(h, "lvm_autoextend_off") == set()  # the exporter: lvm.conf not read
    h.lvm_conf = {}
    assert found(h, "lvm_autoextend_off") == {("lvm_autoextend_off", "dm-3", "info")}
    h.lvm_conf = {"snapshot_autoextend_threshold": 70}
    assert found(h, "lvm_autoextend_off") == set()


def test_every_check_is_documented():
    """docs/metrics.md's table of checks (make metrics-doc, kept current by test_metrics_doc.py)
    has a row for each, saying what it finds."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "metrics.md")) as f:
        doc = f.read()
    every = checks.CHECKS
    missing = [c.id for c in every if not c.doc or f"| `{c.id}` |" not in doc]
    assert not missing, f"checks not in docs/metrics.md's table: {missing}"


def test_the_write_ups_iostat_lineup_is_a_collapse():
    """The NVMe write-up's `iostat -xk 5` (dm-3 47 r/s at 512 sectors over dm-1 and nvme1n1 at
    3000 r/s of 8) as two diskstats samples 5 s apart: without eBPF the layered shape is info
    (the rules page on nothing else either); with nvme1n1's own requests refused merges
    (ebpf_exporter), the collapse is critical, fixed on nvme1n1."""
    from blockstack_exporter.collapse import INTERVAL_KNOBS, collapse_findings
    from blockstack_exporter.lineup import Sample, lineup

    h = host(
        {"dm-3": "dm", "dm-1": "dm", "dm-2": "dm", "nvme1n1": "disk"},
        {"dm-3": ["dm-1", "dm-2"], "dm-1": ["nvme1n1"], "dm-2": ["nvme1n1"]},
        {"nvme1n1": {"nomerges": 2, "max_sectors_kb": 256 * KIB, "max_hw_sectors_kb": 256 * KIB}},
    )
    k = knobs.load(required=INTERVAL_KNOBS)
    zero = {d: (0,) * 6 for d in h.devices}
    after = {
        "dm-3": (235, 0, 235 * 512, 0, 0, 0),
        "dm-1": (15002, 0, 15002 * 8, 0, 0, 0),
        "dm-2": (0,) * 6,
        "nvme1n1": (15000, 0, 15000 * 8, 0, 0, 0),
    }
    rows = lineup(Sample(h, {}, [], zero, None, 0.0), Sample(h, {}, [], after, None, 5.0), 5.0)
    assert rows["dm-3"]["read"]["sectors"] == 512 and rows["nvme1n1"]["read"]["rps"] == 3000
    found_ = collapse_findings(h, rows, k)
    assert [(f.check, f.device, f.severity) for f in found_] == [
        ("merge_collapse", "nvme1n1", "info")
    ]
    assert found_[0].what.startswith("layered: nvme1n1 reads 8-sector requests")
    ebpf = {
        ("issued", "nvme1n1", "read"): 15000,
        ("issued_bytes", "nvme1n1", "read"): 15000 * 4096,
        ("missed_merges", "nvme1n1", "read"): 14000,
        ("splits", "nvme1n1", "read"): 0,
    }
    rows = lineup(Sample(h, {}, [], zero, {}, 0.0), Sample(h, {}, [], after, ebpf, 5.0), 5.0)
    found_ = collapse_findings(h, rows, k)
    assert [(f.check, f.device, f.severity) for f in found_] == [
        ("merge_collapse", "nvme1n1", "critical")
    ]
    assert (
        found_[0].what.startswith("merging refused")
        and "ebpf: 2800 merges/s refused" in found_[0].evidence[2]
    )
    assert found_[0].fix == "echo 0 > /sys/block/nvme1n1/queue/nomerges"
    # healthy: 512 sectors on every layer
    healthy = {d: (v[0] and 235, 0, (v[0] and 235) * 512, 0, 0, 0) for d, v in after.items()}
    rows = lineup(Sample(h, {}, [], zero, None, 0.0), Sample(h, {}, [], healthy, None, 5.0), 5.0)
    assert collapse_findings(h, rows, k) == []


def test_layers_top_down_and_the_stack_flattened():
    """The NVMe incident's stack: dm-3 over its -real and -cow volumes over nvme1n1, which the
    origin dm-2 holds too; a cycle (a damaged tree) ends."""
    h = host(
        {"dm-3": "dm", "dm-2": "dm", "dm-0": "dm", "dm-1": "dm", "nvme1n1": "disk"},
        {"dm-3": ["dm-0", "dm-1"], "dm-2": ["dm-0"], "dm-0": ["nvme1n1"], "dm-1": ["nvme1n1"]},
    )
    assert h.layers("dm-3") == [["dm-3"], ["dm-0", "dm-1"], ["nvme1n1"]]
    assert h.stack("dm-3") == ["dm-3", "dm-0", "dm-1", "nvme1n1"]
    assert h.uppers("nvme1n1") == ["dm-0", "dm-1", "dm-2", "dm-3"]
    h.lower["nvme1n1"] = ["dm-3"]
    assert h.layers("dm-3") == [["dm-3"], ["dm-0", "dm-1"], ["nvme1n1"]]


def test_a_failing_check_costs_its_own_findings_only():
    h = host(
        {"sda": "disk"},
        queue={
            "sda": {
                "rotational": 1,
                "scheduler": "none",
                "max_sectors_kb": 1,
                "max_hw_sectors_kb": "not a number",
            }
        },
    )
    failed = []
    result = checks.evaluate(h, K, failed=failed)
    assert [c for c, _ in failed] == ["max_sectors_low"]
    assert {f.check for f in result} == {"scheduler_mismatch"}


def test_read_ahead_below_the_device_beneath():
    """A dm or md device reading ahead less than a device beneath it (an md array's two stripes,
    a disk's 128 KiB) is named, with the value beneath as the fix; equal or more is not."""
    q = {"md0": {"read_ahead_kb": 3072 * KIB}, "dm-0": {"read_ahead_kb": 128 * KIB}}
    h = host({"dm-0": "dm", "md0": "md"}, {"dm-0": ["md0"]}, q)
    (f,) = [f for f in checks.evaluate(h, K) if f.check == "read_ahead_below_lower"]
    assert (f.device, f.severity) == ("dm-0", "info")
    assert f.fix == "echo 3072 > /sys/block/dm-0/queue/read_ahead_kb"
    assert f.spec == [{"how": "udev", "device": "dm-0", "attr": "read_ahead_kb", "value": "3072"}]
    assert f.evidence[:2] == [
        "/sys/block/dm-0/queue/read_ahead_kb = 128",
        "/sys/block/md0/queue/read_ahead_kb = 3072",
    ]
    q["dm-0"]["read_ahead_kb"] = 3072 * KIB
    assert found(host({"dm-0": "dm", "md0": "md"}, {"dm-0": ["md0"]}, q)) == set()
    # an LVM volume on a partition: the disk's queue is read, lvchange -r is named
    h = host(
        {"dm-1": "dm", "sda1": "partition", "sda": "disk"},
        {"dm-1": ["sda1"], "sda1": ["sda"]},
        {"dm-1": {"read_ahead_kb": 0}, "sda1": {"read_ahead_kb": 128 * KIB}},
    )
    h.devices["dm-1"].update(vg_name="vg", lv_name="data")
    (f,) = [f for f in checks.evaluate(h, K) if f.check == "read_ahead_below_lower"]
    assert f.evidence[1] == "/sys/block/sda/queue/read_ahead_kb = 128"
    assert "lvchange -r auto vg/data" in f.evidence[-1]
    # a disk's own read-ahead is not this check's: nothing beneath it
    assert found(host({"sda": "disk"}, queue={"sda": {"read_ahead_kb": 0}})) == set()
