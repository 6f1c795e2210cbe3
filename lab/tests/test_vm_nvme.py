"""The VM tier (pytest -m vm): the NVMe incident on a real LVM snapshot over emulated NVMe, on
Debian's own kernels booted under QEMU/TCG (blockstack_lab/vm.py, vm_scenarios.py), with the
exporters in the guest and Prometheus (the project's rules), Alertmanager and the page receiver on
the host: snapshot reads at nomerges=0 without a page, then nomerges=2 pages once. Every set of
BPF programs loads, as the variant docs/kernels.md's table names (vm_scenarios.EXPECTED_CONFIGS),
and counts: missed merges at nomerges=2 and not at 0, splits, jbd2 credit waits.
blockstack-doctor, run in the guest in each state, names the snapshot's settings by their LVM
names and nomerges=2 on nvme0n1.

The kernel matrix (make test-kernels runs all four, 3 minutes healthy each): make test boots the
oldest, Debian 11's 5.10, with 30 s healthy, and the newest, Debian sid's, with 2 minutes; 6.1
runs the stacks (test_vm_stacks.py). Under TCG on a busy machine dmsetup in the guest often
outlasts its share of the exporter's scrape deadline, so some scrapes lack the snapshot's series:
the page and the facts read them as of the last scrape that had them (last_over_time), or the page
lost its snapshot vg0/snap. Each test boots its own guest and checks that nothing of it
is left behind."""

import os
import re
import subprocess
import time

import pytest

from blockstack_lab import vm, vm_scenarios
from blockstack_testsupport.clock import seconds, wait_until

pytestmark = [pytest.mark.vm, pytest.mark.root, pytest.mark.servers]

# (kernel, seconds healthy): 5.10 (the oldest kernel, the BPF variant without bpf_loop) in make test,
# sid's in make test-long (the VM tier of make test took 24 min with both on a fresh machine, its
# 25 min goal); make test-kernels (BLOCKSTACK_VM_KERNELS=all) watches every kernel 3 minutes healthy
KERNELS = [("5.10", 30), ("sid", 120)]
LONG = {"sid"}  # marked long in make test's selection
ALL_KERNELS = [("5.10", 180), ("6.1", 180), ("6.12", 180), ("sid", 180)]
# The page within this many seconds of the onset (nomerges 0 -> 2). The product's goal is 40 s at a
# 5 s scrape interval (README), measured per kernel in BENCHMARKS.md; a loaded TCG guest's
# exporters answer late, so the test allows half as much again.
PAGE_SECONDS = 60


def _qemu_of(directory):
    out = subprocess.run(["pgrep", "-f", directory], capture_output=True, text=True).stdout
    return out.split()


def _kernels():
    if os.environ.get("BLOCKSTACK_VM_KERNELS") == "all":
        return [pytest.param(k, s, id=k) for k, s in ALL_KERNELS]
    return [
        pytest.param(k, s, id=k, marks=[pytest.mark.long] if k in LONG else []) for k, s in KERNELS
    ]


def page_shares(description):
    """{cgroup: share} from the page's "Mostly from db.service (75%), backup.service (25%)."."""
    listed = description.partition("Mostly from ")[2]
    return {
        m[1]: float(m[2]) / 100
        for m in re.finditer(r"(\S+(?: [0-9a-f]{12})?) \(([0-9.]+)%\)", listed)
    }


def findings(doctor, check):
    """{device: finding} of one check in a blockstack-doctor report."""
    rc, report = doctor
    return {f["device"]: f for f in report["findings"] if f["check"] == check}


@pytest.mark.parametrize("kernel, healthy", _kernels())
def test_nvme_incident(kernel, healthy, tmp_path):
    problems = vm.missing([kernel])
    if problems:
        pytest.fail("the VM tier needs: " + "; ".join(problems))
    started = time.monotonic()
    guest = vm.Guest(kernel, nvme=1, say=vm.say)
    timing = vm_scenarios.Timing(healthy=healthy)
    with guest:
        directory = guest.dir
        o = vm_scenarios.nvme_incident(guest, str(tmp_path / "stack"), timing, say=vm.say)
        closing = time.monotonic()
    # torn down: no image, no QEMU (its process group killed: gone once the kernel has reaped it)
    assert not os.path.exists(directory)
    wait_until("QEMU's processes gone", lambda: not _qemu_of(directory), 10, 0.2)
    print(
        f"\n{kernel} ({o.release}): boot {o.boot_seconds:.0f} s, then {dict(o.phases)}, power-off "
        f"{time.monotonic() - closing:.0f} s; {time.monotonic() - started:.0f} s in all; healthy "
        f"{o.healthy_seconds:.0f} s, onset->page {o.page_seconds:.0f} s; configs {o.configs}; {o.ebpf_status}; "
        f"{o.facts}"
    )

    # every set of BPF programs loads, as the variant docs/kernels.md's table names
    assert o.configs == vm_scenarios.EXPECTED_CONFIGS[kernel], o.ebpf_status
    assert o.facts["jbd2_waits"] >= 100, o.facts  # 300 synchronous writes, a handle each at least

    # healthy: snapshot reads merged back on nvme0n1, no page at all
    assert o.healthy_seconds >= healthy
    assert not o.healthy_pages, [(p.alertname, p.device) for p in o.healthy_pages]
    rate, sectors = o.healthy_lineup["nvme0n1"]["read"]
    assert sectors >= 64, o.healthy_lineup

    # sick: one page, the collapse on nvme0n1, naming the cause and the snapshot by its LVM name
    assert [(p.alertname, p.device) for p in o.pages] == [("BlockStackMergeCollapse", "nvme0n1")], (
        o.pages
    )
    page = o.pages[0]
    assert "merging refused" in page.annotations["summary"], page.annotations
    # the layer whose requests are cut, by its LVM name: the snapshot ("Above it snapshot vg0/snap
    # (dm-3) averages ..."; "Snapshot vg0/snap (dm-3) sits above it." when no upper carries the
    # bytes), never its origin vg0/lv, whose reads are unaffected
    assert re.search(r"[Ss]napshot vg0/snap \(dm-\d+\)", page.annotations["description"]), (
        page.annotations
    )
    assert "Above it vg0/lv " not in page.annotations["description"], page.annotations
    assert "nomerges=2" in page.annotations["description"], page.annotations
    rate, sectors = o.sick_lineup["nvme0n1"]["read"]
    assert sectors <= 16, o.sick_lineup
    assert o.page_seconds <= seconds(PAGE_SECONDS), o.page_seconds

    # whose I/O: both services reading the snapshot, each named on the page with its share of the
    # refused merges within 10 points of its share of the bytes fio read (3:1 by fio's rates)
    named = page_shares(page.annotations["description"])
    for reader, share in o.fio_shares.items():
        assert abs(named.get(reader, 0) - share) <= 0.10, (named, o.fio_shares)
    # and writeback is charged to the cgroup that wrote the pages, not to the flusher or `sync`
    wb = o.facts["writeback"]
    assert wb.get("writer.service", 0) >= vm_scenarios.WRITEBACK_MIB << 20, wb
    assert wb["writer.service"] > 4 * max(
        (n for c, n in wb.items() if c != "writer.service"), default=0
    ), wb

    # what the exporters in the guest report of the stack
    f, dm = o.facts, o.facts["dm_names"]
    real, cow, origin, snap = dm["vg0-lv-real"], dm["vg0-snap-cow"], dm["vg0-lv"], dm["vg0-snap"]
    assert f["dm"][real] == {
        "name": "vg0-lv-real",
        "vg_name": "vg0",
        "lv_name": "lv",
        "lv_layer": "real",
    }
    assert f["dm"][cow] == {
        "name": "vg0-snap-cow",
        "vg_name": "vg0",
        "lv_name": "snap",
        "lv_layer": "cow",
    }
    assert f["dm"][origin]["lv_name"] == "lv" and f["dm"][snap]["lv_name"] == "snap"
    assert {(real, "nvme0n1"), (cow, "nvme0n1"), (snap, real), (snap, cow), (origin, real)} <= set(
        f["edges"]
    )
    assert [(s["device"], s["origin"], s["cow"]) for s in f["snapshot"]] == [(snap, real, cow)]
    assert f["chunk_bytes"][snap] == 4096
    assert (
        vm_scenarios.COW_MIB << 20
        <= f["cow_used_bytes"][snap]
        < f["cow_size_bytes"][snap]
        == 256 << 20
    )
    # the eBPF counters: dm-snapshot splits every bio in both states; merges refused only at nomerges=2
    assert f["splits_sick"] > 1000
    assert f["missed_merges_sick"] > 1000
    assert f["splits_healthy"] > 1000
    assert f["missed_merges_healthy"] < f["missed_merges_sick"] / 20

    # blockstack-doctor in the guest. Healthy: the snapshot's settings by its LVM name, each only
    # info (exit 0): 4 KiB chunks, its COW 44 % used, ext4 on it with dioread_nolock (the kernel's
    # default) and mkfs's 16 MiB journal for 512 MiB, autoextend off
    rc, report = o.doctor["healthy"]
    assert rc == 0 and {x["severity"] for x in report["findings"]} == {"info"}, report["findings"]
    assert report["devices"][snap]["label"] == f"{snap} (vg0/snap)"
    chunk = findings(o.doctor["healthy"], "snapshot_chunk_small")[snap]
    assert (
        "chunk size 8 sectors (4 KiB)" in chunk["evidence"][0]
        and "lvremove vg0/snap" in chunk["fix"]
    ), chunk
    cow = findings(o.doctor["healthy"], "snapshot_cow_filling")[snap]
    assert (
        "COW 44% used" in cow["what"]
        and "of 256 MiB" in cow["evidence"][0]
        and "vg0/snap" in cow["fix"]
    ), cow
    ext4 = findings(o.doctor["healthy"], "ext4_journal_small")[snap]
    assert "dioread_nolock with a journal of 16 MiB" in ext4["what"], ext4
    assert snap in findings(o.doctor["healthy"], "lvm_autoextend_off")
    assert not findings(o.doctor["healthy"], "nomerges_beneath_stack")
    # sick: nomerges=2 on nvme0n1 beneath the snapshot's layers, a warning (exit 1), with the fix
    rc, report = o.doctor["sick"]
    nomerges = findings(o.doctor["sick"], "nomerges_beneath_stack")
    assert rc == 1 and list(nomerges) == ["nvme0n1"], report["findings"]
    assert nomerges["nvme0n1"]["severity"] == "warning", nomerges
    assert (
        "nomerges=2" in nomerges["nvme0n1"]["what"]
        and f"{real} (vg0/lv real layer)" in nomerges["nvme0n1"]["what"]
    )
    assert nomerges["nvme0n1"]["fix"] == "echo 0 > /sys/block/nvme0n1/queue/nomerges"
    # ... and, run as the page's doctor line says while the page comes, the collapse the page
    # names, at warning or above
    collapse = findings(o.doctor["sick"], "merge_collapse")
    assert collapse.get("nvme0n1", {}).get("severity") in ("warning", "critical"), report[
        "findings"
    ]
