"""What users stack on NVMe besides the NVMe incident's snapshot, and the LVM2 write-up, on real
devices in the VM lab (vm.py): the stacks are built in a Debian guest, the exporters run there,
Prometheus with the project's rules, Alertmanager and the page receiver on the host.

    python -m blockstack_lab.vm_stacks [stacks|lvm2|ext4] [--kernel 6.1]     (make vm-lab-stacks)

stacks: one guest, eight NVMe namespaces: md0 RAID1 (2 devices), md1 RAID5 (3), an LVM thin pool
    vgt/pool with a thin volume vgt/thin1, dm-crypt crypt0 (plain, aes-xts), and one namespace
    shared by two controllers of one NVMe subsystem (native multipath: the head nvmeSn1 over the
    hidden paths nvmeSc*n1). Facts: names, edges, thin-pool data (216 MiB of 256 written) and
    metadata use; blockstack-doctor in the guest; then sequential reads through every top device
    for `healthy` seconds: no page.
lvm2: vg0/lv on one NVMe namespace with a classic snapshot, 256 MiB of direct writes to the
    origin at chunk sizes 4, 64 and 512 KiB (seconds per GiB: the write-up's ordering); the chunk
    alert; then a 40 MiB COW store filled by throttled origin writes: the COW page
    (BlockStackSnapshotCowNearlyFull) before the snapshot turns Invalid, then the Invalid page.
ext4: a 4 MiB journal, dioread_nolock, 128 fsync-heavy writers on one NVMe namespace: the credit
    waits measured by the variant ebpf_exporter's production identity loads (6.1:
    jbd2_credit_wait_legacy) and the jbd2 warning (a ticket, not a page: docs/runbook.md
    "BlockStackJbd2CreditWaitHigh").

NVMe kernel names follow the order the controllers are probed, not QEMU's: devices are found by
their serial (/sys/block/nvmeXnY/device/serial).
"""

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
import time

from blockstack_rules import knobs
from blockstack_testsupport import procs

from . import vm
from .vm_scenarios import dm_names, doctor_summary, firing_pages, latest, serving

MP_SERIAL = "nvme-mp"
# Seven NVMe controllers plus a subsystem of two take 170-240 s to boot under TCG on a loaded 2-core
# machine (measured while eight people shared it); vm.Guest's default of 240 s was not enough.
BOOT_TIMEOUT = 600
# A shell function in the guest: the kernel name of the namespace (not a hidden path) with this serial
BY_SERIAL = r"""nv() { for d in $(ls /sys/block | grep -E '^nvme[0-9]+n1$'); do
  [ "$(tr -d ' ' < /sys/block/$d/device/serial)" = "$1" ] && echo $d; done; true; }
export LVM_SUPPRESS_FD_WARNINGS=1
"""
THIN_USED_MIB = 216
STACKS_SETUP = (
    BY_SERIAL
    + f"""set -e
for m in dm-thin-pool dm-crypt raid1 raid456; do modprobe $m; done
mdadm --create /dev/md0 --run --level=1 --raid-devices=2 --metadata=1.2 --assume-clean /dev/$(nv nvme0) /dev/$(nv nvme1)
mdadm --create /dev/md1 --run --level=5 --raid-devices=3 --metadata=1.2 --assume-clean \
    /dev/$(nv nvme2) /dev/$(nv nvme3) /dev/$(nv nvme4)
vgcreate -q vgt /dev/$(nv nvme5)
lvcreate -q -y -L 256M -V 1G -T vgt/pool -n thin1
head -c 32 /dev/urandom > /tmp/crypt0.key
cryptsetup open --type plain --cipher aes-xts-plain64 --key-size 256 --key-file /tmp/crypt0.key /dev/$(nv nvme6) crypt0
# Only the thin volume needs writing for its reads to reach the pool's device (an unprovisioned
# block reads as zeros from nowhere); the others read their devices as they are. The pool's data
# {THIN_USED_MIB} MiB of 256 (84 %: dmeventd's and the doctor's warning from 80 %).
dd if=/dev/zero of=/dev/vgt/thin1 bs=1M count={THIN_USED_MIB} oflag=direct status=none
"""
)
TOPS = ("md0", "md1", "vgt/thin1", "mapper/crypt0")
# Sequential buffered reads through every top device, from the device every pass
STACKS_READS = BY_SERIAL + (
    "while :; do echo 1 > /proc/sys/vm/drop_caches; for d in "
    + " ".join(f"/dev/{t}" for t in TOPS)
    + f" /dev/$(nv {MP_SERIAL}); do dd if=$d of=/dev/null bs=1M count=64 status=none; done; done"
)


def multipath_opts(image):
    """QEMU options for one namespace on `image` shared by two controllers of one NVMe subsystem."""
    return [
        "-device",
        f"nvme-subsys,id=mpsubsys,nqn={MP_SERIAL}",
        "-device",
        f"nvme,serial={MP_SERIAL},subsys=mpsubsys,id=mpa",
        "-device",
        f"nvme,serial={MP_SERIAL},subsys=mpsubsys,id=mpb",
        "-drive",
        f"file={image},if=none,id=mpns,format=raw,cache=none",
        "-device",
        "nvme-ns,drive=mpns,nsid=1",
    ]


class RulesStack(vm.HostStack):
    """HostStack whose Prometheus reads the rules rendered with some knobs overridden (a shorter
    `for:` to see an alert within a test), written to its work directory."""

    def __init__(self, guest, workdir, overrides=None, **kw):
        super().__init__(guest, workdir, **kw)
        self.overrides = dict(overrides or {})

    def prometheus_config(self):
        config = super().prometheus_config()
        if self.overrides:
            os.makedirs(self.workdir, exist_ok=True)
            paths = []
            for path, text in knobs.rule_files(knobs.load(), **self.overrides).items():
                if path.name == knobs.FLEET_RULES.name:
                    continue
                out = os.path.join(self.workdir, path.name)
                with open(out, "w") as f:
                    f.write(text)
                paths.append(out)
            config["rule_files"] = paths
        return config


def by_serial(guest, serial):
    return guest.run(BY_SERIAL + f"nv {serial}").stdout.strip()


@dataclasses.dataclass
class StacksOutcome:
    release: str
    boot_seconds: float = None
    devices: dict = dataclasses.field(default_factory=dict)  # role -> kernel name
    info: dict = dataclasses.field(default_factory=dict)  # device -> blockstack_device_info labels
    edges: list = dataclasses.field(default_factory=list)  # (device, lower)
    targets: dict = dataclasses.field(default_factory=dict)  # dm device -> [target]
    thin: dict = dataclasses.field(default_factory=dict)  # metric suffix -> value
    lineup: dict = dataclasses.field(default_factory=dict)
    healthy_seconds: float = 0.0
    alerts: list = dataclasses.field(default_factory=list)  # pending or firing during the reads
    pages: list = dataclasses.field(default_factory=list)
    doctor: tuple = None  # blockstack-doctor in the guest during the reads: (exit status, report)
    phases: dict = dataclasses.field(default_factory=vm.Phases)  # seconds per phase after the boot


def stacks(guest, workdir, healthy=90, say=print):
    """Build md RAID1/RAID5, a thin pool, dm-crypt and native multipath (STACKS_SETUP) on a booted
    guest (vm.Guest with nvme >= 7 and multipath_opts), report what the exporters say, read through
    every stack for `healthy` seconds, blockstack-doctor run in the guest meanwhile. A StacksOutcome."""
    out = StacksOutcome(guest.release, guest.boot_seconds)
    phases = out.phases
    guest.settle_ebpf_configs()
    guest.run(STACKS_SETUP, timeout=900)
    dm = dm_names(guest)
    out.devices = {
        "md0": "md0",
        "md1": "md1",
        "crypt": dm["crypt0"],
        "thin": dm["vgt-thin1"],
        "tpool": dm["vgt-pool-tpool"],
        "mp": by_serial(guest, MP_SERIAL),
    }
    out.devices.update({f"nvme{i}": by_serial(guest, f"nvme{i}") for i in range(7)})
    say(f"vm: stacks built: {out.devices}")
    phases.end("setup")
    doctor = guest.start_doctor()  # meanwhile: the stacks are built, the exporters start
    with contextlib.ExitStack() as running:
        running.enter_context(guest.exporters())
        phases.end("exporters")
        view = running.enter_context(serving(RulesStack(guest, workdir)))
        phases.end("servers")
        running.enter_context(guest.background(STACKS_READS))
        tops = [out.devices[k] for k in ("md0", "md1", "crypt", "thin")]

        def reads_seen():
            lineup = view.lineup(tops)
            return lineup if all("read" in lineup.get(d, {}) for d in tops) else None

        seen = procs.wait_until(
            "reads through every stack in Prometheus", reads_seen, 240, interval=2
        )
        # dmsetup in the guest on a busy machine often outlasts the scrape's deadline: wait for a
        # scrape that had the thin pool's status
        procs.wait_until(
            "the thin pool's use in Prometheus",
            lambda: latest(view, "blockstack_dm_thin_pool_data_used_bytes"),
            240,
            interval=2,
        )
        phases.end("reads seen")
        out.info = {
            r["metric"]["device"]: r["metric"] for r in latest(view, "blockstack_device_info")
        }
        out.edges = sorted(
            (r["metric"]["device"], r["metric"]["lower"])
            for r in latest(view, "blockstack_device_lower_info")
        )
        for r in latest(view, "blockstack_dm_target_info"):
            out.targets.setdefault(r["metric"]["device"], []).append(r["metric"]["target"])
        for name in (
            "data_used_bytes",
            "data_size_bytes",
            "metadata_used_bytes",
            "metadata_size_bytes",
            "state",
        ):
            for r in latest(view, "blockstack_dm_thin_pool_" + name):
                out.thin[name if name != "state" else "state_" + r["metric"]["state"]] = float(
                    r["value"][1]
                )
        start = time.time()
        all_devices = list(out.devices.values())
        # each device as last seen reading: the loop reads one device at a time, and on a busy
        # machine a pass over all of them outlasts the rate window
        devices = all_devices + [f"{out.devices['mp'][:-2]}c.*n1"]
        out.lineup = {**seen, **view.lineup(devices)}
        while time.time() - start < healthy:
            time.sleep(min(15, max(0.0, healthy - (time.time() - start))))
            out.alerts = sorted(set(out.alerts) | set(view.alerts(all_devices, with_severity=True)))
            now = view.lineup(devices)
            out.lineup.update(now)
            say(f"vm: +{time.time() - start:.0f}s reads: {now}; alerts {out.alerts or 'none'}")
        out.healthy_seconds = time.time() - start
        out.pages = firing_pages(view, start - 120)
        out.doctor = guest.doctor(job=doctor)
        say(f"vm: blockstack-doctor: {doctor_summary(out.doctor)}")
        phases.end("healthy")
    phases.end("stop")
    return out


@dataclasses.dataclass
class Lvm2Outcome:
    release: str
    boot_seconds: float = None
    seconds_per_gib: dict = dataclasses.field(default_factory=dict)  # chunk KiB -> s/GiB
    no_snapshot_seconds_per_gib: float = None
    chunk_alert: list = dataclasses.field(default_factory=list)  # ALERTS at 4 KiB chunks
    chunk_alert_seconds: float = None
    cow_page_seconds: float = None  # fill start -> BlockStackSnapshotCowNearlyFull at the receiver
    invalid_seconds: float = None  # fill start -> dmsetup status Invalid
    invalid_page_seconds: float = None  # fill start -> BlockStackSnapshotInvalid at the receiver
    cow_page: object = None
    invalid_page: object = None
    pages: list = dataclasses.field(default_factory=list)


LVM2_SETUP = (
    BY_SERIAL
    + """set -e
modprobe dm-snapshot
pvcreate -q /dev/$(nv nvme0)
vgcreate -q vg0 /dev/$(nv nvme0)
lvcreate -q -y -L 512M -n lv vg0
dd if=/dev/zero of=/dev/vg0/lv bs=1M count=512 oflag=direct status=none
"""
)
WRITE_MIB = 256
# Rewrites of the origin after the snapshot: every chunk copied once (direct, 1 MiB requests)
TIMED_WRITE = (
    f"s=$(date +%s.%N); dd if=/dev/urandom of=/dev/vg0/lv bs=1M count={WRITE_MIB} oflag=direct "
    'status=none; e=$(date +%s.%N); awk "BEGIN { print $e - $s }"'
)
# The COW fill: 1 MiB per ~3 s written to the origin until told to stop
THROTTLED_WRITES = (
    "i=0; while [ $i -lt 480 ]; do dd if=/dev/urandom of=/dev/vg0/lv bs=1M count=1 seek=$i "
    "oflag=direct status=none; i=$((i+1)); sleep 3; done"
)


def lvm2(guest, workdir, say=print, chunks=(4, 64, 512), page_timeout=300, chunk_for="30s"):
    """The LVM2 write-up on a booted guest (vm.Guest with nvme >= 1): an Lvm2Outcome. The chunk
    alert's `for:` (30m as shipped) is `chunk_for` here, to see it within the scenario."""
    out = Lvm2Outcome(guest.release, guest.boot_seconds)
    guest.run(LVM2_SETUP, timeout=600)
    t = float(guest.run(TIMED_WRITE, timeout=600).stdout.strip())
    out.no_snapshot_seconds_per_gib = t * 1024 / WRITE_MIB
    for kib in chunks:
        guest.run(f"lvcreate -q -y -s -c {kib}k -L 300M -n snap vg0/lv", timeout=300)
        t = float(guest.run(TIMED_WRITE, timeout=900).stdout.strip())
        out.seconds_per_gib[kib] = t * 1024 / WRITE_MIB
        say(
            f"vm: {WRITE_MIB} MiB direct writes to the origin with a {kib} KiB-chunk snapshot: {t:.2f} s "
            f"({out.seconds_per_gib[kib]:.1f} s/GiB; no snapshot {out.no_snapshot_seconds_per_gib:.1f})"
        )
        guest.run("lvremove -q -y vg0/snap", timeout=300)
    # Alerts: the chunk alert's `for:` shortened to chunk_for; everything else as shipped.
    guest.run("lvcreate -q -y -s -c 4k -L 40M -n snap vg0/lv", timeout=300)
    snap = dm_names(guest)["vg0-snap"]
    with (
        guest.exporters(),
        serving(RulesStack(guest, workdir, {"snapshot_chunk_for": chunk_for})) as view,
    ):
        fill_start = time.time()
        with guest.background(THROTTLED_WRITES):

            def chunk_alert():
                return [
                    a
                    for a in view.alerts([snap], with_severity=True)
                    if a[0] == "BlockStackSnapshotChunkSmall" and a[2] == "firing"
                ]

            out.chunk_alert = procs.wait_until(
                "BlockStackSnapshotChunkSmall firing", chunk_alert, page_timeout, interval=2
            )
            out.chunk_alert_seconds = time.time() - fill_start
            say(f"vm: +{out.chunk_alert_seconds:.0f}s {out.chunk_alert}")

            def page(name):
                return [
                    n
                    for n in firing_pages(view, fill_start)
                    if n.alertname == name and n.device == snap
                ]

            hit = procs.wait_until(
                "the COW page",
                lambda: page("BlockStackSnapshotCowNearlyFull"),
                page_timeout,
                interval=1,
            )
            out.cow_page, out.cow_page_seconds = hit[0], hit[0].received_at - fill_start
            say(
                f"vm: +{out.cow_page_seconds:.0f}s PAGE {hit[0].alertname}: {hit[0].annotations.get('description')}"
            )

            def invalid():
                return "Invalid" in guest.run("dmsetup status vg0-snap").stdout

            procs.wait_until("vg0-snap Invalid", invalid, page_timeout, interval=1)
            out.invalid_seconds = time.time() - fill_start
            say(f"vm: +{out.invalid_seconds:.0f}s dmsetup status vg0-snap: Invalid")
        hit = procs.wait_until(
            "the Invalid page", lambda: page("BlockStackSnapshotInvalid"), page_timeout, interval=1
        )
        out.invalid_page, out.invalid_page_seconds = hit[0], hit[0].received_at - fill_start
        say(
            f"vm: +{out.invalid_page_seconds:.0f}s PAGE {hit[0].alertname}: {hit[0].annotations.get('summary')}"
        )
        out.pages = firing_pages(view, fill_start)
    return out


@dataclasses.dataclass
class Ext4Outcome:
    release: str
    boot_seconds: float = None
    configs: str = ""  # the ebpf_exporter configs the guest's kernel loads
    wait_seconds: float = None  # host_device:ebpf_jbd2_credit_wait_seconds:avg at the warning
    waits_per_second: float = None
    alert_seconds: float = None  # writers' start -> the warning at the ticket receiver
    ticket: object = None
    pages: list = dataclasses.field(default_factory=list)


EXT4_MNT = "/tmp/blockstack-ext4"
# The ext4 write-up on the guest's NVMe: a 4 MiB journal, dioread_nolock (6.1's default, named),
# 128 tasks of 16 KiB random buffered writes each followed by fdatasync
EXT4_SETUP = (
    BY_SERIAL
    + f"""set -e
mkfs.ext4 -q -F -J size=4 -E lazy_itable_init=0,lazy_journal_init=0,nodiscard /dev/$(nv nvme0)
mkdir -p {EXT4_MNT}
mount -o dioread_nolock /dev/$(nv nvme0) {EXT4_MNT}
"""
)
EXT4_WRITERS = (
    f"fio --name=fsync --directory={EXT4_MNT} --rw=randwrite --bs=16k --ioengine=psync --fdatasync=1 "
    "--buffered=1 --numjobs=128 --size=4m --time_based --runtime=900 --group_reporting"
)


def ext4(guest, workdir, say=print, alert_timeout=420):
    """The ext4 write-up on a booted guest (vm.Guest with nvme >= 1): an Ext4Outcome."""
    out = Ext4Outcome(guest.release, guest.boot_seconds)
    guest.run(EXT4_SETUP, timeout=600)
    dev = by_serial(guest, "nvme0")
    out.configs = guest.ebpf_configs()
    say(f"vm: ext4 on {dev} (4 MiB journal, dioread_nolock); ebpf configs {out.configs}")
    with guest.exporters(ebpf_configs=out.configs), serving(RulesStack(guest, workdir)) as view:
        start = time.time()
        with guest.background(EXT4_WRITERS):

            def ticket():
                return [
                    n
                    for n in view.notifications(start)
                    if n.alertname == "BlockStackJbd2CreditWaitHigh" and n.status == "firing"
                ]

            hit = procs.wait_until("the jbd2 warning", ticket, alert_timeout, interval=2)
            out.ticket, out.alert_seconds = hit[0], hit[0].received_at - start
            out.wait_seconds = view.jbd2_wait(dev)
            out.waits_per_second = view.prometheus.value(
                f'host_device:ebpf_jbd2_credit_wait:rate{{device="{dev}"}}'
            )
            say(
                f"vm: +{out.alert_seconds:.0f}s {hit[0].alertname} ({hit[0].labels.get('severity')}): "
                f"{' '.join(hit[0].annotations.get('description', '').split())}"
            )
        out.pages = firing_pages(view, start)
    return out


def run(scenario, kernel="6.1", say=print, **kw):
    with contextlib.ExitStack() as es:
        workdir = es.enter_context(tempfile.TemporaryDirectory(prefix="blockstack-vm-stacks-"))
        if scenario == "stacks":
            image = os.path.join(workdir, "multipath.img")
            with open(image, "wb") as f:
                f.truncate(1 << 30)
            g = es.enter_context(
                vm.Guest(
                    kernel,
                    nvme=7,
                    nvme_size=1 << 30,
                    say=say,
                    qemu_opts=multipath_opts(image),
                    boot_timeout=BOOT_TIMEOUT,
                )
            )
            return stacks(g, os.path.join(workdir, "stack"), say=say, **kw)
        g = es.enter_context(vm.Guest(kernel, nvme=1, say=say, boot_timeout=BOOT_TIMEOUT))
        return {"lvm2": lvm2, "ext4": ext4}[scenario](
            g, os.path.join(workdir, "stack"), say=say, **kw
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description="NVMe stacks and the LVM2 write-up in the VM lab")
    ap.add_argument(
        "scenarios",
        nargs="*",
        default=["stacks", "lvm2", "ext4"],
        choices=["stacks", "lvm2", "ext4"],
    )
    ap.add_argument("--kernel", default="6.1")
    args = ap.parse_args(argv)
    if not vm.ready([args.kernel]):
        return 2
    for s in args.scenarios:
        o = run(s, args.kernel, say=vm.say)
        vm.say(f"{s}: {o}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
