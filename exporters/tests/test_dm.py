"""The dm collector against recorded `dmsetup table` / `dmsetup status --noflush` outputs.

The real collector runs: it starts tests/fake_dmsetup as its dmsetup (a subprocess, with the
timeout), which prints fixtures/dm/<scenario>/dmsetup_<args joined by _>. Each scenario's sysfs
is built in tmp_path from the compact description in SYSFS below. Where each fixture comes from:
fixtures/dm/README.md.
"""

import os
import time

import pytest
from exporter_testlib import Scraped, registry_for
from hypothesis import given, settings
from hypothesis import strategies as st

from blockstack_exporter.collectors import dm
from blockstack_exporter.collectors.dm_parse import (
    parse_line,
    parse_listing,
    parse_origin_table,
    parse_snapshot_status,
    parse_snapshot_table,
    parse_thin_pool_status,
    parse_thin_pool_table,
)
from blockstack_exporter.collectors.queue import QueueCollector
from blockstack_exporter.fs import ParseError
from blockstack_testsupport.clock import seconds, wait_until

DM_FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "dm")
DM_ONLY = ("--collector.disable-defaults", "--collector.dm")
SECTOR = 512

# One line per block device: `disk NAME MAJ:MIN`, `part NAME MAJ:MIN DISK`, `dm dm-N MAJ:MIN DMNAME`.
# dm uuids are LVM-style placeholders (the collector does not use them).
SYSFS = {
    # The LVM-snapshot-on-NVMe incident: nvme1n1 (259,0 in its btrace), seclv + snapshot tmp_backup1.
    "nvme-incident": """
        disk nvme1n1 259:0
        dm   dm-0 253:0 secvol-seclv
        dm   dm-1 253:1 secvol-seclv-real
        dm   dm-2 253:2 secvol-tmp_backup1-cow
        dm   dm-3 253:3 secvol-tmp_backup1
    """,
    # snapshot.rst "How snapshot-merge is used by LVM2": base 254:10, -real 254:11, -cow 254:12 on 8:19.
    "snapshot-merge": """
        disk sdb 8:16
        part sdb3 8:19 sdb
        dm   dm-10 254:10 volumeGroup-base
        dm   dm-11 254:11 volumeGroup-base-real
        dm   dm-12 254:12 volumeGroup-base-cow
    """,
    "snapshot-states": """
        disk sda 8:0
        part sda2 8:2 sda
        part sda3 8:3 sda
        dm   dm-0 253:0 vg0-data
        dm   dm-1 253:1 vg0-data-real
        dm   dm-2 253:2 vg0-full-cow
        dm   dm-3 253:3 vg0-full
        dm   dm-4 253:4 vg0-kept-cow
        dm   dm-5 253:5 vg0-kept
        dm   dm-6 253:6 vg1-home-real
        dm   dm-7 253:7 vg1-home-cow
        dm   dm-8 253:8 vg1-home
    """,
    # dm-devel 2020-05-08 (Michal Soltys): thin pool tp_ssd, metadata raid1 on sda3/sdb3, data on md125.
    "thin-pool": """
        disk sda 8:0
        part sda3 8:3 sda
        disk sdb 8:16
        part sdb3 8:19 sdb
        disk md125 9:125
        dm   dm-0 253:0 x22v0-tp_ssd_tmeta_rmeta_0
        dm   dm-1 253:1 x22v0-tp_ssd_tmeta_rimage_0
        dm   dm-2 253:2 x22v0-tp_ssd_tmeta_rmeta_1
        dm   dm-3 253:3 x22v0-tp_ssd_tmeta_rimage_1
        dm   dm-4 253:4 x22v0-tp_ssd_tmeta
        dm   dm-5 253:5 x22v0-tp_ssd_tdata
        dm   dm-6 253:6 x22v0-tp_ssd-tpool
        dm   dm-7 253:7 x22v0-tp_ssd
        dm   dm-8 253:8 x22v0-gitlab_root
        dm   dm-9 253:9 x22v0-gerrit--new
        dm   dm-10 253:10 x22v0-gerrit--root
    """,
    "unknown-targets": """
        disk sdb 8:16
        part sdb3 8:19 sdb
        dm   dm-0 253:0 debian_crypt
        dm   dm-1 253:1 goodram_ssd-root
        dm   dm-2 253:2 goodram_ssd-home
        dm   dm-3 253:3 frob-test
    """,
    # dm-7 is in sysfs but not in dmsetup's listing (removed between the two reads); ghost-dev
    # is listed by dmsetup but not in sysfs.
    "garbage": """
        disk sda 8:0
        part sda2 8:2 sda
        dm   dm-0 253:0 g-real
        dm   dm-1 253:1 g-snap-cow
        dm   dm-2 253:2 g-snap
        dm   dm-3 253:3 g-bad
        dm   dm-4 253:4 g-pool
        dm   dm-5 253:5 g-pool2
        dm   dm-6 253:6 g-origin
        dm   dm-7 253:7 vanished-lv
        dm   dm-8 253:8 g-ok
    """,
    "no-dm": """
        disk vda 254:0
    """,
}


def build_sysfs(root, description):
    """A minimal sysfs: class/block links, dev/block links, dm/name and dm/uuid (with newline)."""
    sysfs = os.path.join(root, "sys")
    for d in ("class/block", "dev/block", "devices/virtual/block", "devices/pci0000:00/block"):
        os.makedirs(os.path.join(sysfs, d), exist_ok=True)
    for line in description.splitlines():
        if not line.strip():
            continue
        kind, name, devno, *rest = line.split()
        if kind == "dm":
            rel = f"devices/virtual/block/{name}"
        elif kind == "part":
            rel = f"devices/pci0000:00/block/{rest[0]}/{name}"
        else:
            rel = f"devices/pci0000:00/block/{name}"
        os.makedirs(os.path.join(sysfs, rel), exist_ok=True)
        os.symlink(f"../../{rel}", os.path.join(sysfs, "class/block", name))
        os.symlink(f"../../{rel}", os.path.join(sysfs, "dev/block", devno))
        if kind == "dm":
            os.makedirs(os.path.join(sysfs, rel, "dm"))
            with open(os.path.join(sysfs, rel, "dm", "name"), "w") as f:
                f.write(rest[0] + "\n")
            with open(os.path.join(sysfs, rel, "dm", "uuid"), "w") as f:
                f.write(f"LVM-fixture{rest[0]}\n")
    return root


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Points fake_dmsetup at a scenario; returns a function scenario -> one Scraped scrape of
    the exporter's registry with the dm collector (and the collectors named in `also`)."""
    log = tmp_path / "dmsetup.log"
    monkeypatch.setenv("FAKE_DMSETUP_LOG", str(log))
    for var in ("FAKE_DMSETUP_MODE", "FAKE_DMSETUP_ONLY", "FAKE_DMSETUP_SLEEP"):
        monkeypatch.delenv(var, raising=False)

    def registry(scenario, sysfs=None, flags=()):
        monkeypatch.setenv("FAKE_DMSETUP_FIXTURES", os.path.join(DM_FIXTURES, scenario))
        return registry_for(
            build_sysfs(str(tmp_path / "root"), sysfs or SYSFS[scenario]), *DM_ONLY, *flags
        )

    def scrape(scenario, sysfs=None, dmsetup=None, timeout=5.0, also=()):
        flags = [f"--collector.dm.timeout={timeout}", *(f"--collector.{c}" for c in also)]
        if dmsetup:
            flags.append(f"--collector.dm.dmsetup={dmsetup}")
        return Scraped(registry(scenario, sysfs, flags))

    scrape.registry = registry
    scrape.calls = lambda: log.read_text().splitlines() if log.exists() else []
    return scrape


# --- scenarios ---------------------------------------------------------------------------------


def incident_snapshot_info(r):
    """The NVMe incident's snapshot (dm-3 over dm-1 and dm-2) as blockstack_dm_snapshot_info
    publishes it: 1, or None when it is not published."""
    return r.get(
        "blockstack_dm_snapshot_info",
        device="dm-3",
        name="secvol-tmp_backup1",
        origin="dm-1",
        cow="dm-2",
        persistent="P",
        merge="false",
    )


def test_nvme_incident_snapshot_of_seclv(fake):
    r = fake("nvme-incident")
    assert r.success("dm") == 1 and r.errors("dm") == 0
    for device, name, target in (
        ("dm-0", "secvol-seclv", "snapshot-origin"),
        ("dm-1", "secvol-seclv-real", "linear"),
        ("dm-2", "secvol-tmp_backup1-cow", "linear"),
        ("dm-3", "secvol-tmp_backup1", "snapshot"),
    ):
        assert r.get("blockstack_dm_target_info", device=device, name=name, target=target) == 1
    snap = dict(device="dm-3", name="secvol-tmp_backup1")
    assert incident_snapshot_info(r) == 1
    assert (
        r.get("blockstack_dm_snapshot_chunk_size_bytes", **snap) == 4096
    )  # lvcreate's default, 8 sectors
    assert r.get("blockstack_dm_snapshot_cow_used_bytes", **snap) == 208 * SECTOR
    assert (
        r.get("blockstack_dm_snapshot_cow_size_bytes", **snap) == 75497472 * SECTOR
    )  # 36 GiB, 90%FREE
    assert r.get("blockstack_dm_snapshot_metadata_bytes", **snap) == 16 * SECTOR
    assert r.get("blockstack_dm_snapshot_state", **snap, state="valid") == 1
    for other in ("invalid", "overflow", "merge_failed", "merging"):
        assert r.get("blockstack_dm_snapshot_state", **snap, state=other) == 0
    assert (
        r.get(
            "blockstack_dm_snapshot_origin_info", device="dm-0", name="secvol-seclv", origin="dm-1"
        )
        == 1
    )
    # linear and snapshot-origin devices carry no snapshot series
    assert (
        r.get("blockstack_dm_snapshot_chunk_size_bytes", device="dm-0", name="secvol-seclv") is None
    )
    assert [c.split(" ", 1)[1] for c in fake.calls()] == [
        "dmsetup table",
        "dmsetup status --noflush",
    ]


def test_snapshot_merge_in_progress(fake):
    r = fake("snapshot-merge")
    assert r.success("dm") == 1 and r.errors("dm") == 0
    base = dict(device="dm-10", name="volumeGroup-base")
    assert r.get("blockstack_dm_target_info", **base, target="snapshot-merge") == 1
    assert (
        r.get(
            "blockstack_dm_snapshot_info",
            **base,
            origin="dm-11",
            cow="dm-12",
            persistent="P",
            merge="true",
        )
        == 1
    )
    assert r.get("blockstack_dm_snapshot_origin_info", **base, origin="dm-11") == 1
    assert r.get("blockstack_dm_snapshot_state", **base, state="merging") == 1
    assert r.get("blockstack_dm_snapshot_state", **base, state="valid") == 0
    assert r.get("blockstack_dm_snapshot_chunk_size_bytes", **base) == 16 * SECTOR
    assert r.get("blockstack_dm_snapshot_cow_used_bytes", **base) == 281688 * SECTOR
    assert r.get("blockstack_dm_snapshot_cow_size_bytes", **base) == 2097152 * SECTOR
    assert r.get("blockstack_dm_snapshot_metadata_bytes", **base) == 1104 * SECTOR


def test_invalid_overflow_and_merge_failed_snapshots(fake):
    r = fake("snapshot-states")
    assert r.success("dm") == 1
    assert r.errors("dm") == 0  # states the exporter observed, not errors in reading them
    cases = (
        ("dm-3", "vg0-full", "invalid"),
        ("dm-5", "vg0-kept", "overflow"),
        ("dm-8", "vg1-home", "merge_failed"),
    )
    for device, name, state in cases:
        for s in ("valid", "invalid", "overflow", "merge_failed", "merging"):
            assert r.get("blockstack_dm_snapshot_state", device=device, name=name, state=s) == (
                s == state
            )
        # the kernel reports no usage for them; the table is still known
        assert r.get("blockstack_dm_snapshot_cow_used_bytes", device=device, name=name) is None
        assert (
            r.get("blockstack_dm_snapshot_chunk_size_bytes", device=device, name=name) is not None
        )
    assert (
        r.get(
            "blockstack_dm_snapshot_info",
            device="dm-5",
            name="vg0-kept",
            origin="dm-1",
            cow="dm-4",
            persistent="PO",
            merge="false",
        )
        == 1
    )
    assert (
        r.get("blockstack_dm_snapshot_origin_info", device="dm-8", name="vg1-home", origin="dm-6")
        == 1
    )


def test_thin_pool_usage_in_bytes(fake):
    r = fake("thin-pool")
    assert r.success("dm") == 1 and r.errors("dm") == 0
    pool = dict(device="dm-6", name="x22v0-tp_ssd-tpool")
    block = 3072 * SECTOR  # the table's data block size: 1.5 MiB, the RAID stripe
    assert r.get("blockstack_dm_thin_pool_data_used_bytes", **pool) == 629535 * block
    assert (
        r.get("blockstack_dm_thin_pool_data_size_bytes", **pool)
        == 838960 * block
        == 2577285120 * SECTOR
    )
    assert r.get("blockstack_dm_thin_pool_metadata_used_bytes", **pool) == 8886 * 4096
    assert (
        r.get("blockstack_dm_thin_pool_metadata_size_bytes", **pool)
        == 552960 * 4096
        == 4423680 * SECTOR
    )
    assert r.get("blockstack_dm_thin_pool_state", **pool, state="rw") == 1
    assert r.get("blockstack_dm_thin_pool_state", **pool, state="fail") == 0
    # lvs in the same post: Data% 75.04, Meta% 1.61
    assert round(100 * 629535 / 838960, 2) == 75.04 and round(100 * 8886 / 552960, 2) == 1.61
    assert (
        r.get("blockstack_dm_target_info", device="dm-4", name="x22v0-tp_ssd_tmeta", target="raid")
        == 1
    )
    assert (
        r.get("blockstack_dm_target_info", device="dm-8", name="x22v0-gitlab_root", target="thin")
        == 1
    )
    # tdata has two linear segments: one target_info series, not two
    assert len([s for s in r.series("blockstack_dm_target_info") if s["device"] == "dm-5"]) == 1
    assert len(r.series("blockstack_dm_target_info")) == 11


def test_unknown_targets_get_target_info_only_and_no_key_material(fake):
    r = fake("unknown-targets")
    assert r.success("dm") == 1 and r.errors("dm") == 0
    assert (
        r.get("blockstack_dm_target_info", device="dm-0", name="debian_crypt", target="crypt") == 1
    )
    assert (
        r.get("blockstack_dm_target_info", device="dm-3", name="frob-test", target="frobnicate")
        == 1
    )
    assert len([s for s in r.series("blockstack_dm_target_info") if s["device"] == "dm-3"]) == 1
    assert "logon" not in r.text and "aes-xts" not in r.text
    # no snapshot, snapshot-merge or thin-pool target: nothing to read in `dmsetup status`
    assert [c.split(" ", 1)[1] for c in fake.calls()] == ["dmsetup table"]


def test_garbage_is_counted_and_the_rest_is_published(fake, caplog):
    r = fake("garbage")
    assert r.success("dm") == 1
    # 3 bad table lines, 1 bad status line, ghost-dev not in sysfs, dm-7 not in dmsetup, g-snap bad
    # status, g-bad bad table, g-pool2 without status, g-origin's 253:99 unknown (g-pool's Fail is
    # its state, not an error)
    assert r.errors("dm") == 10
    assert r.get("blockstack_dm_thin_pool_state", device="dm-4", name="g-pool", state="fail") == 1
    assert r.get("blockstack_dm_thin_pool_state", device="dm-4", name="g-pool", state="rw") == 0
    assert r.get("blockstack_dm_target_info", device="dm-8", name="g-ok", target="linear") == 1
    assert r.get("blockstack_dm_target_info", device="dm-3", name="g-bad", target="snapshot") == 1
    assert r.get("blockstack_dm_snapshot_chunk_size_bytes", device="dm-2", name="g-snap") == 4096
    assert r.get("blockstack_dm_snapshot_cow_used_bytes", device="dm-2", name="g-snap") is None
    assert r.get("blockstack_dm_thin_pool_data_size_bytes", device="dm-4", name="g-pool") is None
    assert (
        r.get("blockstack_dm_snapshot_origin_info", device="dm-6", name="g-origin", origin="253:99")
        == 1
    )
    assert not any(s["device"] == "dm-7" for s in r.series("blockstack_dm_target_info"))
    assert "vanished-lv" in caplog.text and "ghost-dev" in caplog.text


def test_no_dm_devices_means_no_dmsetup_call(fake, monkeypatch):
    monkeypatch.setenv("FAKE_DMSETUP_MODE", "fail")  # would fail the collector if it ran
    r = fake("nvme-incident", sysfs=SYSFS["no-dm"])
    assert r.success("dm") == 1 and r.errors("dm") == 0
    assert fake.calls() == []


# --- dmsetup failing ---------------------------------------------------------------------------


def test_dmsetup_missing_binary_fails_only_the_dm_collector(fake, tmp_path):
    r = fake("nvme-incident", dmsetup=str(tmp_path / "no-such-dmsetup"), also=["jbd2"])
    assert r.success("dm") == 0 and r.errors("dm") == 1
    assert r.success("jbd2") == 1 and r.errors("jbd2") == 0


@pytest.mark.parametrize(
    "mode,message",
    [
        ("fail", "exited with 1: /dev/mapper/control: open failed: Permission denied"),
        ("absent", "exited with 127"),
    ],
)
def test_dmsetup_exiting_non_zero(fake, monkeypatch, caplog, mode, message):
    monkeypatch.setenv("FAKE_DMSETUP_MODE", mode)
    r = fake("nvme-incident", also=["jbd2"])
    assert r.success("dm") == 0 and r.errors("dm") == 1
    assert r.success("jbd2") == 1
    assert message in caplog.text


def test_dmsetup_hanging_is_killed_at_the_timeout(fake, monkeypatch):
    monkeypatch.setenv("FAKE_DMSETUP_MODE", "hang")
    monkeypatch.setenv("FAKE_DMSETUP_SLEEP", "30")
    start = time.monotonic()
    r = fake("nvme-incident", timeout=0.5, also=["jbd2"])
    assert time.monotonic() - start < seconds(5)
    assert r.success("dm") == 0 and r.errors("dm") == 1 and r.success("jbd2") == 1
    (pid,) = [int(c.split()[0]) for c in fake.calls()]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


def test_status_hanging_keeps_the_tables(fake, monkeypatch):
    monkeypatch.setenv("FAKE_DMSETUP_MODE", "hang")
    monkeypatch.setenv("FAKE_DMSETUP_ONLY", "status")
    monkeypatch.setenv("FAKE_DMSETUP_SLEEP", "30")
    r = fake("nvme-incident", timeout=seconds(0.5))  # table answers within it, status hangs
    assert r.success("dm") == 1 and r.errors("dm") == 1  # the timeout, reported once
    snap = dict(device="dm-3", name="secvol-tmp_backup1")
    assert r.get("blockstack_dm_snapshot_chunk_size_bytes", **snap) == 4096
    assert r.get("blockstack_dm_snapshot_cow_used_bytes", **snap) is None
    assert r.get("blockstack_dm_snapshot_state", **snap, state="valid") is None


def test_table_timing_out_keeps_the_last_table_of_the_same_devices(fake, monkeypatch, tmp_path):
    """On a loaded VM a `dmsetup table` past the deadline made blockstack_dm_snapshot_info blink
    out for a scrape, and a page's description lost its snapshot sentence."""
    registry = fake.registry("nvme-incident", flags=[f"--collector.dm.timeout={seconds(0.5)}"])
    event = control_fifo(str(tmp_path / "root"))
    snap = dict(device="dm-3", name="secvol-tmp_backup1")
    assert Scraped(registry).get("blockstack_dm_snapshot_chunk_size_bytes", **snap) == 4096
    monkeypatch.setenv("FAKE_DMSETUP_MODE", "hang")
    monkeypatch.setenv("FAKE_DMSETUP_SLEEP", "30")
    event()  # the table is read again, and times out
    r = Scraped(registry)
    assert commands(fake)[2] == "dmsetup table"
    assert r.success("dm") == 1 and r.errors("dm") >= 1  # counted all the same
    assert incident_snapshot_info(r) == 1
    assert r.get("blockstack_dm_snapshot_chunk_size_bytes", **snap) == 4096
    assert (
        r.get("blockstack_dm_snapshot_cow_used_bytes", **snap) is None
    )  # status is never stood in for


def test_table_timing_out_after_the_devices_changed_fails_the_collector(
    fake, monkeypatch, tmp_path
):
    registry = fake.registry("nvme-incident", flags=[f"--collector.dm.timeout={seconds(0.5)}"])
    assert Scraped(registry).success("dm") == 1
    monkeypatch.setenv("FAKE_DMSETUP_MODE", "hang")
    monkeypatch.setenv("FAKE_DMSETUP_SLEEP", "30")
    root = str(tmp_path / "root")
    os.unlink(os.path.join(root, "sys/class/block/dm-3"))  # the snapshot removed
    r = Scraped(registry)
    assert r.success("dm") == 0 and r.get("blockstack_dm_snapshot_info", device="dm-3") is None


def test_device_vanished_between_sysfs_and_dmsetup(fake):
    r = fake("nvme-incident", sysfs=SYSFS["nvme-incident"] + "\n dm dm-4 253:4 secvol-gone")
    assert r.success("dm") == 1 and r.errors("dm") == 1
    assert (
        r.get("blockstack_dm_snapshot_chunk_size_bytes", device="dm-3", name="secvol-tmp_backup1")
        == 4096
    )


# --- parsers -----------------------------------------------------------------------------------


def test_parsers_on_documented_lines():
    # snapshot.rst: "# dmsetup status volumeGroup-snap" / "0 8388608 snapshot 397896/2097152 1560"
    assert parse_snapshot_status("397896/2097152 1560") == {
        "state": "valid",
        "used_sectors": 397896,
        "total_sectors": 2097152,
        "metadata_sectors": 1560,
    }
    assert parse_snapshot_status("16/2097152")["metadata_sectors"] is None  # before 2.6.33
    assert parse_snapshot_status("Invalid")["state"] == "invalid"
    assert parse_snapshot_status("Merge failed")["state"] == "merge_failed"
    assert parse_snapshot_status("Overflow")["state"] == "overflow"
    assert parse_snapshot_table("254:11 254:12 P 16")["chunk_sectors"] == 16
    t = parse_snapshot_table("254:11 254:12 PO 8 2 discard_zeroes_cow discard_passdown_origin")
    assert t["persistent"] == "PO" and t["features"] == [
        "discard_zeroes_cow",
        "discard_passdown_origin",
    ]
    assert parse_origin_table("254:11") == "254:11"
    assert parse_thin_pool_status("Fail") == {"failed": "Fail"}
    s = parse_thin_pool_status(
        "19 8886/552960 629535/838960 - rw no_discard_passdown queue_if_no_space - 1024 "
    )
    assert (s["used_data_blocks"], s["total_data_blocks"], s["mode"], s["held_root"]) == (
        629535,
        838960,
        "rw",
        None,
    )
    assert parse_thin_pool_table("253:4 253:5 3072 0 1 skip_block_zeroing")["features"] == [
        "skip_block_zeroing"
    ]
    assert parse_line("x22v0-tp_ssd_tdata: 0 2147696640 linear ").params == ""
    assert parse_line("vg-a\\x20b: 0 8 zero").name == "vg-a b"  # dmsetup mangles a space as \x20
    assert parse_listing("No devices found\n") == ([], [])
    for bad in ("", "no colon here", ": 0 1 linear", "x: 0 y linear"):
        with pytest.raises(ParseError):
            parse_line(bad)
    for bad in ("1/2 3 4", "1/x 3", "Invalidated", "12 4"):
        with pytest.raises(ParseError):
            parse_snapshot_status(bad)


PARSERS = (
    parse_line,
    parse_snapshot_status,
    parse_snapshot_table,
    parse_origin_table,
    parse_thin_pool_status,
    parse_thin_pool_table,
)
WORD = st.one_of(
    st.text(max_size=12),
    st.integers(0, 2**64).map(str),
    st.sampled_from(
        [
            "253:1",
            "P",
            "PO",
            "N",
            "-",
            "rw",
            "ro",
            "Fail",
            "Invalid",
            "1/2",
            "/",
            ":",
            "0",
            "snapshot",
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(WORD, max_size=9).map(" ".join)))
def test_parsers_raise_only_parse_error(text):
    for parse in PARSERS:
        try:
            parse(text)
        except ParseError:
            pass
    targets, errors = parse_listing(text)  # never raises: bad lines are returned as errors
    assert all(isinstance(e, ParseError) for _, e in errors)


U64 = st.integers(0, 2**64 - 1)
NAME = st.text(st.sampled_from("abcXYZ019#+-.:=@_"), min_size=1, max_size=20).filter(
    lambda n: ": " not in n
)


@given(U64, U64, st.one_of(st.none(), U64))
def test_snapshot_status_round_trips(used, total, metadata):
    line = (
        f"{used}/{total}" if metadata is None else f"{used}/{total} {metadata}"
    )  # dm-snap.c DMEMIT
    assert parse_snapshot_status(line) == {
        "state": "valid",
        "used_sectors": used,
        "total_sectors": total,
        "metadata_sectors": metadata,
    }


@given(
    U64,
    U64,
    U64,
    U64,
    U64,
    st.one_of(st.none(), U64),
    st.sampled_from(["rw", "ro", "out_of_data_space"]),
    st.booleans(),
)
def test_thin_pool_status_round_trips(txn, um, tm, ud, td, held, mode, needs_check):
    # dm-thin.c pool_status: every field followed by a space
    line = (
        f"{txn} {um}/{tm} {ud}/{td} {'-' if held is None else held} {mode} discard_passdown "
        f"queue_if_no_space {'needs_check' if needs_check else '-'} 1024 "
    )
    assert parse_thin_pool_status(line) == {
        "failed": None,
        "transaction_id": txn,
        "used_metadata_blocks": um,
        "total_metadata_blocks": tm,
        "used_data_blocks": ud,
        "total_data_blocks": td,
        "held_root": held,
        "mode": mode,
        "needs_check": needs_check,
    }


@given(
    NAME,
    U64,
    U64,
    st.sampled_from(["linear", "snapshot", "thin-pool", "crypt", "x"]),
    st.lists(
        st.text(st.characters(blacklist_categories=("Cs", "Zs", "Cc")), min_size=1), max_size=5
    ),
)
def test_table_line_round_trips(name, start, length, target, params):
    line = f"{name}: {start} {length} {target} {' '.join(params)}"
    t = parse_line(line)
    assert (t.name, t.start, t.length, t.target, t.params.split()) == (
        name,
        start,
        length,
        target,
        params,
    )


@given(
    st.sampled_from(["P", "PO", "N"]),
    st.integers(1, 2**20),
    st.integers(0, 4096),
    st.integers(0, 4096),
)
def test_snapshot_table_round_trips(store, chunk, origin_minor, cow_minor):
    t = parse_snapshot_table(f"253:{origin_minor} 253:{cow_minor} {store} {chunk}")
    assert (t["origin"], t["cow"], t["persistent"], t["chunk_sectors"]) == (
        f"253:{origin_minor}",
        f"253:{cow_minor}",
        store,
        chunk,
    )


def test_unchanged_output_is_not_parsed_again_but_still_counted(fake):
    """The same dmsetup output twice: the second scrape reuses the parsed families (reading
    less), yet reports the same errors again and the same series."""
    registry = fake.registry("garbage")
    first = Scraped(registry)
    second = Scraped(registry)
    assert first.errors("dm") == 10 and second.errors("dm") == 20

    def dm_series(r):
        return {k: v for k, v in r.samples.items() if k[0].startswith("blockstack_dm_")}

    assert dm_series(first) == dm_series(second) and len(dm_series(first)) > 5
    # the status on both scrapes, the table once (nothing said it changed)
    assert commands(fake) == ["dmsetup table"] + ["dmsetup status --noflush"] * 2


# --- the table kept while nothing says it changed (dm.KeptTable) -----------------------------------


def commands(fake):
    """The dmsetup commands run so far, in order."""
    return [c.split(" ", 1)[1] for c in fake.calls()]


def control_fifo(root):
    """A FIFO in place of ROOT/dev/mapper/control (--path.dev=ROOT/dev), polled as the control
    node is: after an event (the function returned: a writer opens and closes it) a reader polls
    readable (POLLHUP, fs/pipe.c pipe_poll) until it opens the FIFO anew, as dm_poll does once
    dm_global_event_nr has moved."""
    path = os.path.join(root, "dev", "mapper", "control")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mkfifo(path)

    def event():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    return event


class Host:
    """A tree whose dm devices and dmsetup output a test changes between scrapes: sysfs from a
    SYSFS-style description (build_sysfs), fake_dmsetup's fixtures in a directory of its own."""

    def __init__(self, tmp_path, monkeypatch, sysfs, table, status=""):
        self.root = build_sysfs(str(tmp_path / "root"), sysfs)
        self.fixtures = tmp_path / "dmsetup"
        self.fixtures.mkdir()
        monkeypatch.setenv("FAKE_DMSETUP_FIXTURES", str(self.fixtures))
        self.dmsetup(table, status)

    def dmsetup(self, table=None, status=None):
        """What fake_dmsetup prints from now on."""
        for command, text in (("dmsetup_table", table), ("dmsetup_status_--noflush", status)):
            if text is not None:
                (self.fixtures / command).write_text(text)

    def registry(self):
        return registry_for(self.root, *DM_ONLY)

    def add(self, line):
        build_sysfs(self.root, line)

    def remove(self, name, devno):
        for link in (f"class/block/{name}", f"dev/block/{devno}"):
            os.unlink(os.path.join(self.root, "sys", link))

    def rename(self, name, new):
        # in place, as sysfs shows it: the exporter keeps the attribute open
        with open(os.path.join(self.root, "sys/devices/virtual/block", name, "dm/name"), "w") as f:
            f.write(new + "\n")


TWO_LVS = """
    disk sda 8:0
    dm   dm-0 253:0 vg-lv
    dm   dm-1 253:1 vg-data
"""
TWO_TABLES = "vg-lv: 0 2048 linear 8:0 0\nvg-data: 0 2048 linear 8:0 2048\n"


def target(r, device, name, kind):
    return r.get("blockstack_dm_target_info", device=device, name=name, target=kind)


@pytest.mark.parametrize("control", ["none", "fifo"])
def test_a_second_scrape_runs_no_table_and_reads_the_snapshot_use_again(
    fake, monkeypatch, tmp_path, control
):
    incident = os.path.join(DM_FIXTURES, "nvme-incident")
    host = Host(
        tmp_path,
        monkeypatch,
        SYSFS["nvme-incident"],
        open(os.path.join(incident, "dmsetup_table")).read(),
        open(os.path.join(incident, "dmsetup_status_--noflush")).read(),
    )
    if control == "fifo":  # a control node that saw no event: as none (the bound only)
        control_fifo(host.root)
    registry = host.registry()
    snap = dict(device="dm-3", name="secvol-tmp_backup1")
    assert Scraped(registry).get("blockstack_dm_snapshot_cow_used_bytes", **snap) == 208 * SECTOR
    status = (host.fixtures / "dmsetup_status_--noflush").read_text()
    host.dmsetup(status=status.replace("208/", "4096/"))  # the snapshot filling
    r = Scraped(registry)
    assert r.success("dm") == 1 and r.errors("dm") == 0
    assert r.get("blockstack_dm_snapshot_cow_used_bytes", **snap) == 4096 * SECTOR  # fresh
    assert incident_snapshot_info(r) == 1  # the table's facts, kept
    assert commands(fake) == ["dmsetup table"] + ["dmsetup status --noflush"] * 2


def test_without_a_snapshot_or_thin_pool_a_second_scrape_runs_no_dmsetup(
    fake, monkeypatch, tmp_path
):
    host = Host(tmp_path, monkeypatch, TWO_LVS, TWO_TABLES)
    registry = host.registry()
    first, second = Scraped(registry), Scraped(registry)
    assert target(first, "dm-1", "vg-data", "linear") == target(second, "dm-1", "vg-data", "linear")
    assert second.success("dm") == 1 and commands(fake) == ["dmsetup table"]


def add(host, event):
    host.add("dm dm-2 253:2 vg-new")
    host.dmsetup(TWO_TABLES + "vg-new: 0 1024 linear 8:0 4096\n")
    return [("dm-2", "vg-new", "linear", 1)]


def remove(host, event):
    host.remove("dm-1", "253:1")
    host.dmsetup(TWO_TABLES.split("\n")[0] + "\n")
    return [("dm-1", "vg-data", "linear", None)]


def rename(host, event):
    host.rename("dm-1", "vg-renamed")
    host.dmsetup(TWO_TABLES.replace("vg-data", "vg-renamed"))
    return [("dm-1", "vg-data", "linear", None), ("dm-1", "vg-renamed", "linear", 1)]


def reload(host, event):
    """`dmsetup reload vg-data` + `resume` to a table of the same size on the same device: sysfs
    shows nothing of it, the control node an event."""
    host.dmsetup(
        TWO_TABLES.replace("2048 linear 8:0 2048", "2048 crypt aes-xts-plain64 - 0 8:0 2048")
    )
    event()
    return [("dm-1", "vg-data", "linear", None), ("dm-1", "vg-data", "crypt", 1)]


@pytest.mark.parametrize("change", [add, remove, rename, reload])
def test_a_table_change_shows_in_the_next_scrape(fake, monkeypatch, tmp_path, change):
    host = Host(tmp_path, monkeypatch, TWO_LVS, TWO_TABLES)
    event = control_fifo(host.root)
    registry = host.registry()
    assert target(Scraped(registry), "dm-1", "vg-data", "linear") == 1
    expected = change(host, event)
    r = Scraped(registry)
    assert r.success("dm") == 1 and r.errors("dm") == 0
    for device, name, kind, value in expected:
        assert target(r, device, name, kind) == value, (device, name, kind)
    assert commands(fake) == ["dmsetup table"] * 2
    Scraped(registry)
    assert commands(fake) == ["dmsetup table"] * 2  # and kept again after it


def test_a_reload_nothing_signals_shows_once_the_table_is_the_bound_old(
    fake, monkeypatch, tmp_path
):
    """Without a control node (a container without it, a test's tree) the same reload is seen
    within TABLE_MAX_AGE."""
    now = [1000.0]
    monkeypatch.setattr(dm, "monotonic", lambda: now[0])
    host = Host(tmp_path, monkeypatch, TWO_LVS, TWO_TABLES)
    registry = host.registry()
    Scraped(registry)
    reload(host, lambda: None)
    now[0] += dm.TABLE_MAX_AGE - 1
    assert target(Scraped(registry), "dm-1", "vg-data", "linear") == 1  # not yet
    now[0] += 1
    assert target(Scraped(registry), "dm-1", "vg-data", "crypt") == 1
    assert commands(fake) == ["dmsetup table"] * 2


def test_a_control_node_that_always_polls_readable_reads_the_table_every_scrape(
    fake, monkeypatch, tmp_path
):
    """As a kernel without dm_poll (before 4.14) answers, and any file that is not the control
    node: every scrape is a change."""
    host = Host(tmp_path, monkeypatch, TWO_LVS, TWO_TABLES)
    os.makedirs(os.path.join(host.root, "dev", "mapper"))
    open(os.path.join(host.root, "dev", "mapper", "control"), "w").close()
    registry = host.registry()
    for _ in range(3):
        assert Scraped(registry).success("dm") == 1
    assert commands(fake) == ["dmsetup table"] * 3


# --- the status begun at the scrape's start (DmCollector.begin) ----------------------------------

STATUS = "dmsetup status --noflush"


def incident_host(tmp_path, monkeypatch):
    """The NVMe incident's devices (a snapshot: a status every scrape) as a Host."""
    incident = os.path.join(DM_FIXTURES, "nvme-incident")
    return Host(
        tmp_path,
        monkeypatch,
        SYSFS["nvme-incident"],
        open(os.path.join(incident, "dmsetup_table")).read(),
        open(os.path.join(incident, "dmsetup_status_--noflush")).read(),
    )


def in_queue_turn(monkeypatch, action):
    """action() runs in the queue collector's turn (the first), after its reading."""
    collect = QueueCollector.collect

    def collect_then_act(self, scrape):
        families = list(collect(self, scrape))
        action()
        return families

    monkeypatch.setattr(QueueCollector, "collect", collect_then_act)


def status_started(fake, n, timeout=10):
    """Whether fake_dmsetup's log shows n status runs started, waiting up to seconds(timeout)."""
    try:
        return wait_until(
            f"{n} status runs", lambda: commands(fake).count(STATUS) >= n, timeout, 0.005
        )
    except TimeoutError:
        return False


def test_the_status_runs_while_the_collectors_before_dm_read(fake, monkeypatch, tmp_path):
    """Once the table is kept, `dmsetup status` starts with the scrape, before the queue and
    stack collectors' turns end, instead of after them (its fork, exec and ioctls overlap their
    reading); dm's turn reads its answer."""
    host = incident_host(tmp_path, monkeypatch)
    registry = registry_for(host.root, *DM_ONLY, "--collector.queue", "--collector.stack")
    Scraped(registry)  # the table read, then the status: nothing kept yet to start from
    status = (host.fixtures / "dmsetup_status_--noflush").read_text()
    host.dmsetup(status=status.replace("208/", "4096/"))  # the snapshot filling
    started_in_queue_turn = []
    in_queue_turn(monkeypatch, lambda: started_in_queue_turn.append(status_started(fake, 2)))
    r = Scraped(registry)
    assert started_in_queue_turn == [True]
    assert r.success("dm") == 1 and r.errors("dm") == 0 and r.success("queue") == 1
    snap = dict(device="dm-3", name="secvol-tmp_backup1")
    assert r.get("blockstack_dm_snapshot_cow_used_bytes", **snap) == 4096 * SECTOR  # this one's
    assert commands(fake) == ["dmsetup table", STATUS, STATUS]


@pytest.mark.parametrize(
    "mode,reason,message",
    [
        ("fail", "command", "exited with 1: /dev/mapper/control: open failed: Permission denied"),
        ("hang", "timeout", "timed out after"),
    ],
)
def test_a_status_begun_early_fails_as_one_run_in_its_turn(
    fake, monkeypatch, tmp_path, caplog, mode, reason, message
):
    host = incident_host(tmp_path, monkeypatch)
    registry = registry_for(host.root, *DM_ONLY, f"--collector.dm.timeout={seconds(0.5)}")
    assert Scraped(registry).errors("dm") == 0
    monkeypatch.setenv("FAKE_DMSETUP_MODE", mode)
    monkeypatch.setenv("FAKE_DMSETUP_ONLY", "status")
    monkeypatch.setenv("FAKE_DMSETUP_SLEEP", "30")
    start = time.monotonic()
    r = Scraped(registry)
    assert time.monotonic() - start < seconds(5)
    assert r.success("dm") == 1 and r.errors("dm") == r.errors("dm", reason) == 1
    assert message in caplog.text
    snap = dict(device="dm-3", name="secvol-tmp_backup1")
    assert incident_snapshot_info(r) == 1  # the kept table's facts
    assert r.get("blockstack_dm_snapshot_cow_used_bytes", **snap) is None  # never stood in for
    assert commands(fake) == ["dmsetup table", STATUS, STATUS]  # run once, not again
    pid = int(fake.calls()[-1].split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # exited or killed, and reaped


def test_devices_changed_without_an_event_read_the_table_then_the_status(
    fake, monkeypatch, tmp_path
):
    """begin() cannot see sysfs's devices: it starts the status on the event token alone. When
    the devices turn out changed, the table is read again and the status after it, as without
    begin; the status begun is stopped, unread."""
    host = incident_host(tmp_path, monkeypatch)
    registry = host.registry()
    Scraped(registry)
    host.add("dm dm-4 253:4 secvol-new")
    host.dmsetup(
        (host.fixtures / "dmsetup_table").read_text() + "secvol-new: 0 8 linear 259:0 0\n",
        (host.fixtures / "dmsetup_status_--noflush").read_text() + "secvol-new: 0 8 linear \n",
    )
    r = Scraped(registry)
    assert r.success("dm") == 1 and r.errors("dm") == 0
    assert target(r, "dm-4", "secvol-new", "linear") == 1
    assert commands(fake) == ["dmsetup table", STATUS, STATUS, "dmsetup table", STATUS]


class Abandoned(BaseException):
    """Escapes the collectors' isolation (an Exception would only fail their turn)."""


def pipes():
    """This process's descriptors of pipes."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the listing's own descriptor, closed
    return {fd: link for fd, link in fds.items() if link.startswith("pipe:")}


def test_a_scrape_that_raises_leaves_no_dmsetup_running(fake, monkeypatch, tmp_path):
    host = incident_host(tmp_path, monkeypatch)
    registry = registry_for(host.root, *DM_ONLY, "--collector.queue")
    Scraped(registry)
    monkeypatch.setenv("FAKE_DMSETUP_MODE", "hang")
    monkeypatch.setenv("FAKE_DMSETUP_ONLY", "status")
    monkeypatch.setenv("FAKE_DMSETUP_SLEEP", "30")
    before = pipes()
    started = []

    def abandon():
        started.append(status_started(fake, 2))  # it runs, and would for 30 s
        raise Abandoned()

    in_queue_turn(monkeypatch, abandon)
    start = time.monotonic()
    with pytest.raises(Abandoned):
        list(registry.collect())
    assert time.monotonic() - start < seconds(5)  # not waited for: killed
    assert started == [True]
    pid = int(fake.calls()[-1].split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped: no zombie
    assert pipes() == before  # its stdout and stderr closed
