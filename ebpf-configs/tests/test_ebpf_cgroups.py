"""Per-cgroup attribution (block_cgroups.bpf.h) on real I/O: two cgroups at once on one device
whose bios are split, each charged exactly its own bios, bytes and pieces; then 1,000 short-lived
cgroups doing I/O on a device while two busy ones keep theirs, the series within the budget.

Block cgroups are made where this host keeps them: the cgroup v1 blkio hierarchy if it is mounted
(this machine: systemd's hybrid layout), else cgroup v2 with the io controller enabled below the
root. Every cgroup made is removed, also on failure; every loop is bounded in count and time.
"""

import contextlib
import json
import math
import os
import subprocess
import time

import pytest
from ebpf_testlib import settle

from blockstack_lab import loop
from blockstack_testsupport.clock import seconds, wait_until

pytestmark = [pytest.mark.root]

SIZE = 256 << 20
# block_cgroups.bpf.h: CGROUP_SLOTS named slots per device, "other" beside them, at most one
# eviction per window of 2^CGROUP_WINDOW_SHIFT jiffies
SLOTS = 5
WINDOW_JIFFIES = 2**12


def jiffies():
    with open("/proc/timer_list") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("jiffies:"))


def window_seconds():
    """The window in seconds on this kernel (its HZ, measured over half a second)."""
    before, started = jiffies(), time.monotonic()
    time.sleep(0.5)
    hz = (jiffies() - before) / (time.monotonic() - started)
    return WINDOW_JIFFIES / hz


COUNTERS = [
    "ebpf_exporter_block_cgroup_bios_total",
    "ebpf_exporter_block_cgroup_bio_bytes_total",
    "ebpf_exporter_block_cgroup_missed_merges_total",
    "ebpf_exporter_block_cgroup_splits_total",
]
ADMISSIONS = "ebpf_exporter_block_cgroup_admissions_total"
EVICTIONS = "ebpf_exporter_block_cgroup_evictions_total"
# The series one device may have: per operation (read, write) each counter for the named slots
# and "other", one admission series per slot and "other", and the eviction counter.
BUDGET = (SLOTS + 1) * len(COUNTERS) * 2 + (SLOTS + 1) + 1


def block_cgroup_root():
    """Where a directory made is a block cgroup: the v1 blkio mount, or the v2 root with io."""
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" - ") for line in f]
    for left, right in mounts:
        fstype, _, options = right.split()[:3]
        if fstype == "cgroup" and "blkio" in options.split(","):
            return left.split()[4]
    for left, right in mounts:
        if right.split()[0] == "cgroup2":
            return left.split()[4]
    pytest.fail("no cgroup hierarchy with the block controller is mounted")


@contextlib.contextmanager
def cgroup_parent(name):
    """A test cgroup under the block cgroup root (on v2 with io enabled for its children); on
    leaving, its processes are killed and it and its children removed."""
    root = block_cgroup_root()
    parent = os.path.join(root, name)
    os.mkdir(parent)
    try:
        control = os.path.join(parent, "cgroup.subtree_control")
        if os.path.exists(control):  # v2
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                f.write("+io")
            with open(control, "w") as f:
                f.write("+io")
        yield parent
    finally:
        remove_tree(parent)


def remove_tree(path):
    for directory, _, _ in sorted(os.walk(path), key=lambda w: -w[0].count("/")):

        def removed():  # its processes killed, then EBUSY until they have left
            if os.path.isdir(directory):
                with open(os.path.join(directory, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), 9)
                os.rmdir(directory)
            return True

        wait_until(f"{directory} removed", removed, 30, 0.1)


def in_cgroup(cgroup, argv):
    """argv run in `cgroup` (sh moves itself in, then execs)."""
    return ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *argv]


def fio_read(cgroup, dev, offset, size):
    return subprocess.Popen(
        in_cgroup(
            cgroup,
            [
                "fio",
                f"--name={os.path.basename(cgroup)}",
                f"--filename={dev}",
                "--rw=read",
                "--bs=64k",
                "--direct=1",
                "--ioengine=libaio",
                "--iodepth=4",
                f"--offset={offset}",
                f"--size={size}",
                "--output-format=json",
            ],
        ),
        stdout=subprocess.PIPE,
        text=True,
    )


def named(scrape, devno):
    """{cgroup_id: cgroup name} of the device's named slots and "other"."""
    return {
        ls["cgroup_id"]: ls["cgroup"]
        for ls, _ in scrape.series(ADMISSIONS)
        if ls.get("devno") == devno
    }


def device_series(scrape, devno=None):
    """The per-cgroup series of device devno, or of every device."""
    return [
        (name, ls)
        for name in [*COUNTERS, ADMISSIONS, EVICTIONS]
        for ls, _ in scrape.series(name)
        if devno is None or ls.get("devno") == devno
    ]


def host_series(scrape):
    """(series, devices with any) of the whole host."""
    series = device_series(scrape)
    return len(series), len({ls["devno"] for _, ls in series})


@pytest.fixture
def device():
    with loop.attached(SIZE) as dev:
        yield dev


def test_two_cgroups_at_once_are_each_charged_their_own_bios_and_pieces(exporter, device):
    """db reads 48 MiB and backup 16 MiB of the same device at the same time, in 64 KiB direct
    reads cut into 4 KiB requests (max_sectors_kb=4): each cgroup's bios, bytes and split-off
    pieces are exactly its own (15 pieces per bio), named after its cgroup directory."""
    devno = str(os.stat(device).st_rdev)
    with (
        cgroup_parent("blockstack-test-who") as parent,
        loop.sysfs_setting(device, "queue/max_sectors_kb", "4"),
    ):
        sizes = {"db.service": 48 << 20, "backup.service": 16 << 20}
        for name in sizes:
            os.mkdir(os.path.join(parent, name))
        settle()
        before = exporter.scrape()
        jobs = {
            name: fio_read(os.path.join(parent, name), device, i * (64 << 20), size)
            for i, (name, size) in enumerate(sizes.items())
        }
        reports = {name: json.loads(job.communicate(timeout=120)[0]) for name, job in jobs.items()}
        settle()
        after = exporter.scrape()
    ids = {name: i for i, name in named(after, devno).items()}
    assert set(sizes) <= set(ids), named(after, devno)
    for name, size in sizes.items():
        assert reports[name]["jobs"][0]["read"]["io_bytes"] == size, reports[name]

        def grew(metric, cgroup_id=ids[name]):
            labels = {"devno": devno, "operation": "read", "cgroup_id": cgroup_id}
            return after.value(metric, **labels) - before.value(metric, **labels)

        bios = size // (64 << 10)
        assert grew("ebpf_exporter_block_cgroup_bio_bytes_total") == size, name
        assert grew("ebpf_exporter_block_cgroup_bios_total") == bios, name
        assert grew("ebpf_exporter_block_cgroup_splits_total") == 15 * bios, name
        assert grew("ebpf_exporter_block_cgroup_missed_merges_total") == 0, name
    parent_name = os.path.basename(parent)
    assert {
        ls["parent"]
        for ls, _ in after.series(ADMISSIONS)
        if ls.get("devno") == devno and ls["cgroup"] in sizes
    } == {parent_name}


CHURN = 1000  # short-lived cgroups
CHURN_SECONDS = seconds(240)  # the bound on the churn loop


def test_1000_short_lived_cgroups_keep_the_series_within_the_budget(exporter, device):
    """Two busy cgroups read the device throughout while 1,000 short-lived ones each make a
    cgroup, read 256 KiB from it and go, over 4 eviction windows (~69 s at HZ=250). Scraped all along: the
    device never has more series than BUDGET; every cgroup named beyond the free slots took its
    slot by an eviction (counted, at most one per window); the busy ones keep their names."""
    devno = str(os.stat(device).st_rdev)
    window = window_seconds()
    seen, most, scrapes, host_most = set(), 0, 0, (0, 0)
    with cgroup_parent("blockstack-test-churn") as parent:
        busy = {}
        for i, name in enumerate(["db.service", "backup.service"]):
            os.mkdir(os.path.join(parent, name))
            busy[name] = subprocess.Popen(
                in_cgroup(
                    os.path.join(parent, name),
                    [
                        "fio",
                        f"--name={name}",
                        f"--filename={device}",
                        "--rw=read",
                        "--bs=128k",
                        "--direct=1",
                        f"--offset={i * (64 << 20)}",
                        "--size=64m",
                        "--rate=8m",
                        "--time_based",
                        f"--runtime={CHURN_SECONDS + 60:.0f}",
                    ],
                ),
                stdout=subprocess.DEVNULL,
            )

        def busy_named():  # each takes a free slot at its first bio
            scrape = exporter.scrape()
            slots = {
                (ls.get("parent"), ls["cgroup"])
                for ls, _ in scrape.series(ADMISSIONS)
                if ls.get("devno") == devno
            }
            return {(os.path.basename(parent), name) for name in busy} <= slots and scrape

        try:
            before = wait_until("both busy cgroups in named slots", busy_named, 60, 0.2)
            evictions_before = before.value(EVICTIONS, devno=devno)
            started = time.monotonic()
            pace = 4.2 * window / CHURN  # over 4 windows: a slot held by a gone cgroup halves
            # each window, and a challenger must outdo it
            for i in range(CHURN):
                if time.monotonic() - started > CHURN_SECONDS:
                    pytest.fail(f"{i} short-lived cgroups in {CHURN_SECONDS} s")
                cgroup = os.path.join(parent, f"job-{i}.scope")
                os.mkdir(cgroup)
                subprocess.run(
                    in_cgroup(
                        cgroup,
                        [
                            "dd",
                            f"if={device}",
                            "of=/dev/null",
                            "bs=64k",
                            "count=4",
                            f"skip={128 * 16 + i % 1000}",
                            "iflag=direct",
                            "status=none",
                        ],
                    ),
                    check=True,
                    timeout=30,
                )
                os.rmdir(cgroup)
                if i % 25 == 0:
                    scrape = exporter.scrape()
                    scrapes += 1
                    series = device_series(scrape, devno)
                    most = max(most, len(series))
                    host_most = max(host_most, host_series(scrape))
                    seen |= set(named(scrape, devno).items())
                time.sleep(max(0.0, started + (i + 1) * pace - time.monotonic()))
            churn_seconds = time.monotonic() - started
            settle()
            after = exporter.scrape()
            seen |= set(named(after, devno).items())
            final = named(after, devno)
            most = max(most, len(device_series(after, devno)))
            host_most = max(host_most, host_series(after))
        finally:
            for job in busy.values():
                job.kill()
                job.wait(timeout=30)
    evictions = after.value(EVICTIONS, devno=devno) - evictions_before
    print(
        f"{CHURN} short-lived cgroups in {churn_seconds:.0f} s, {scrapes} scrapes: at most {most} "
        f"series on the device (budget {BUDGET}), at most {host_most[0]} on the host "
        f"({host_most[1]} devices), {len(seen)} named cgroups seen, "
        f"{evictions:.0f} evictions (window {window:.1f} s); named at the end: {sorted(final.values())}"
    )
    assert most <= BUDGET, most
    assert host_most[0] <= BUDGET * host_most[1], host_most
    # at most one eviction per window (t->evicted holds the window's number, jiffies >> 12), and
    # a churn of churn_seconds touches at most ceil(churn_seconds / window) + 1 of those windows
    assert 1 <= evictions <= math.ceil(churn_seconds / window) + 1, evictions
    # every cgroup named: the free slots' first holders, then one per eviction ("other" aside)
    assert len({i for i, name in seen if i != "0"}) <= SLOTS + evictions, seen
    assert {"db.service", "backup.service"} <= set(final.values()), final
