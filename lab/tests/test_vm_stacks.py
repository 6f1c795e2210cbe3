"""The VM tier (pytest -m vm), what else users stack on NVMe (blockstack_lab/vm_stacks.py): one
Debian 6.1 guest with md RAID1 and RAID5, an LVM thin pool, dm-crypt and NVMe native multipath,
the exporters in the guest, Prometheus with the project's rules, Alertmanager and the receiver on
the host. What the exporters name and link, and sequential reads through every stack that must
not page. The LVM2 write-up (chunk sizes, the COW page, the Invalid page) is test_lvm2_write_up,
marked vm_long: make test-vm-long, not make test."""

import os
import time

import pytest

from blockstack_lab import vm, vm_stacks

pytestmark = [pytest.mark.vm, pytest.mark.root, pytest.mark.servers]


HEALTHY_SECONDS = 60


@pytest.fixture
def vm_prerequisites():
    problems = vm.missing(["6.1"])
    if problems:
        pytest.fail("the VM tier needs: " + "; ".join(problems))


def test_nvme_stacks_report_and_stay_quiet(vm_prerequisites, tmp_path):
    started = time.monotonic()
    image = tmp_path / "multipath.img"
    image.write_bytes(b"")
    os.truncate(image, 1 << 30)
    with vm.Guest(
        "6.1",
        nvme=7,
        nvme_size=1 << 30,
        qemu_opts=vm_stacks.multipath_opts(image),
        boot_timeout=vm_stacks.BOOT_TIMEOUT,
        say=vm.say,
    ) as guest:
        directory = guest.dir
        o = vm_stacks.stacks(guest, str(tmp_path / "stack"), healthy=HEALTHY_SECONDS, say=vm.say)
        closing = time.monotonic()
    assert not os.path.exists(directory)
    print(
        f"\n{o.release}: boot {o.boot_seconds:.0f} s, then {dict(o.phases)}, power-off "
        f"{time.monotonic() - closing:.0f} s; {time.monotonic() - started:.0f} s in all; {o}"
    )
    d, edges = o.devices, set(o.edges)

    # md: kind md, the kernel name, an edge to each member
    assert o.info["md0"]["kind"] == "md" and o.info["md1"]["kind"] == "md"
    assert {("md0", d["nvme0"]), ("md0", d["nvme1"])} <= edges
    assert {("md1", d[f"nvme{i}"]) for i in (2, 3, 4)} <= edges
    # dm-crypt: its dm name and uuid, the crypt target, on its NVMe device; the key never exported
    crypt = o.info[d["crypt"]]  # Prometheus keeps no empty label: vg_name absent
    assert (crypt["name"], crypt["uuid"], crypt.get("vg_name", "")) == (
        "crypt0",
        "CRYPT-PLAIN-crypt0",
        "",
    )
    assert o.targets[d["crypt"]] == ["crypt"] and (d["crypt"], d["nvme6"]) in edges
    # thin: the pool under LVM names (layer tpool), the thin volume above it, use in bytes
    tpool = o.info[d["tpool"]]
    assert (tpool["vg_name"], tpool["lv_name"], tpool["lv_layer"]) == ("vgt", "pool", "tpool")
    assert (d["thin"], d["tpool"]) in edges and o.targets[d["thin"]] == ["thin"]
    assert o.thin["data_size_bytes"] == 256 << 20 and o.thin["metadata_size_bytes"] == 4 << 20
    assert vm_stacks.THIN_USED_MIB << 20 <= o.thin["data_used_bytes"] < 256 << 20
    assert 0 < o.thin["metadata_used_bytes"] < 4 << 20
    assert o.thin["state_rw"] == 1
    # native multipath: the namespace's head over its two hidden paths
    mp = d["mp"]
    paths = sorted(low for dev, low in edges if dev == mp)
    assert len(paths) == 2 and all(p.startswith(mp[:-2] + "c") for p in paths), (mp, paths)

    # healthy: large requests at every layer, nothing pending or firing, no page
    assert o.healthy_seconds >= HEALTHY_SECONDS
    for dev in ("md0", "md1", d["crypt"], d["thin"], d["nvme0"], d["nvme2"], d["nvme6"]):
        rate, sectors = o.lineup[dev]["read"]
        assert sectors >= 64, (dev, o.lineup)
    assert not [a for a in o.alerts if a[3] == "critical"], o.alerts
    assert not o.pages, [(p.alertname, p.device) for p in o.pages]

    # blockstack-doctor in the guest: the thin pool's data use by its LVM name, a warning (exit 1);
    # its metadata use below the threshold; dm-crypt on NVMe without the workqueue bypass flags
    rc, report = o.doctor
    found = {(f["check"], f["device"]): f for f in report["findings"]}
    assert rc == 1 and {f["severity"] for f in report["findings"]} == {"warning", "info"}, report[
        "findings"
    ]
    pool = found["thin_pool_full", d["tpool"]]
    assert pool["severity"] == "warning" and pool["what"].startswith("thin pool data 84% used"), (
        pool
    )
    assert pool["evidence"] == ["dmsetup status vgt-pool-tpool: data 216 MiB of 256 MiB"], pool
    assert pool["fix"] == "lvextend -L +<size> vgt/pool", pool
    assert [f["what"] for f in report["findings"] if f["check"] == "thin_pool_full"] == [
        pool["what"]
    ]  # not metadata
    crypt = found["crypt_workqueue", d["crypt"]]
    assert (
        crypt["what"]
        == f"dm-crypt over non-rotational {d['nvme6']} without no_read_workqueue and no_write_workqueue"
    )
    assert (
        "cryptsetup refresh --perf-no_read_workqueue --perf-no_write_workqueue crypt0"
        == crypt["fix"]
    ), crypt
    assert ("lvm_autoextend_off", d["tpool"]) in found
    assert [
        k for k in found if k[0] not in ("thin_pool_full", "crypt_workqueue", "lvm_autoextend_off")
    ] == []


@pytest.mark.vm_long
def test_lvm2_write_up(vm_prerequisites, tmp_path):
    with vm.Guest("6.1", nvme=1, boot_timeout=vm_stacks.BOOT_TIMEOUT) as guest:
        directory = guest.dir
        o = vm_stacks.lvm2(guest, str(tmp_path / "stack"))
    assert not os.path.exists(directory)
    print(f"\n{o.release}: {o}")
    # the write-up's ordering: 4 KiB chunks the slowest, every snapshot slower than none
    s = o.seconds_per_gib
    assert s[4] > s[64] and s[4] > s[512], s
    assert min(s.values()) > o.no_snapshot_seconds_per_gib, (s, o.no_snapshot_seconds_per_gib)
    # the chunk alert (info) on the snapshot while the origin takes writes
    assert [a[0] for a in o.chunk_alert] == ["BlockStackSnapshotChunkSmall"] and o.chunk_alert[0][
        3
    ] == "info"
    # the COW page before the kernel invalidates the snapshot, naming it by VG/LV; then the Invalid page
    assert o.cow_page_seconds < o.invalid_seconds, o
    assert "vg0/snap" in o.cow_page.annotations["description"], o.cow_page.annotations
    assert (
        o.invalid_page.annotations["summary"]
        == "Snapshot vg0-snap on vm-6.1 is invalid; its data is gone."
    )
    assert sorted({p.alertname for p in o.pages}) == [
        "BlockStackSnapshotCowNearlyFull",
        "BlockStackSnapshotInvalid",
    ]


@pytest.mark.vm_long
def test_ext4_write_up(vm_prerequisites, tmp_path):
    with vm.Guest("6.1", nvme=1, boot_timeout=vm_stacks.BOOT_TIMEOUT) as guest:
        directory = guest.dir
        o = vm_stacks.ext4(guest, str(tmp_path / "stack"))
    assert not os.path.exists(directory)
    print(f"\n{o.release}: {o}")
    # 6.1 under the production identity: the legacy raw tracepoint variant (the modules' BTF,
    # which the fexit variant needs, takes CAP_SYS_ADMIN)
    assert "jbd2_credit_wait_legacy" in o.configs
    # the warning as the runbook describes it: a ticket naming the options and the journal size
    t = o.ticket
    assert t.path == "/ticket" and t.labels["severity"] == "warning", t
    assert (
        "dioread_nolock=1" in t.annotations["description"]
        and "journal size 4MiB" in t.annotations["description"]
        and "of the handle starts found the journal full" in t.annotations["description"]
    ), t
    assert o.wait_seconds > 0.0005 and o.waits_per_second >= 100
    assert not o.pages, [(p.alertname, p.device) for p in o.pages]
