"""The incidents on real devices in the VM lab (vm.py): scenarios that build a device stack in a
guest, run the exporters there and the servers with the project's rules on the host, and report
what the user sees (the page at the receiver, its text) and what the exporters report.

    python -m blockstack_lab.vm_scenarios [KERNEL ...]      (make vm-lab; default 5.10 6.1 6.12 sid)

The NVMe incident (docs/incidents, "nomerges=2 under an LVM snapshot on NVMe"): volume group vg0 on
nvme0n1, logical volume vg0/lv with ext4 and a 200 MiB file, a classic snapshot vg0/snap of it
with 4 KiB chunks, mounted; the file read buffered through the snapshot in a loop (page cache
dropped every pass). dm-snapshot cuts every bio into 4 KiB chunks (a split per chunk); at
nomerges=0 the NVMe queue merges them back (~510-sector requests on nvme0n1), at nomerges=2 it
cannot: 8-sector requests, each one a refused merge, and the collapse page on nvme0n1. The origin
takes 112 MiB of writes after the snapshot is taken (its COW store 44 % used), and blockstack-doctor
runs in the guest in both states.

Kernels differ in what diskstats shows of the snapshot: on every kernel of the matrix (5.10 on) dm accounts the split
bios, so the snapshot's dm-N shows 8-sector requests at either nomerges (the write-up's iostat,
dm at 512 over nvme at 8, is an older kernel's); only nvme0n1's request size, the missed-merge
counter and the split counter show the contrast.
"""

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
import types

from blockstack_testsupport import procs

from . import vm
from .view import StackView

# the guest sees the host's root read-only: mountpoints on its own tmpfs
MNT_ORIGIN, MNT_SNAP = "/tmp/blockstack-lv", "/tmp/blockstack-snap"
DATA_MIB = 200
SERVERS = ("receiver", "alertmanager", "prometheus")  # on the host
# What ebpf-configs/select-configs.sh chooses on each kernel of the matrix under ebpf_exporter's
# production identity (vm.Guest.ebpf_identity; docs/kernels.md's kernel table, which
# tests/test_docs.py holds to this): block_io needs bpf_loop() (5.17); jbd2's fexit and tp_btf
# variants need the ext4 and jbd2 modules' BTF, which libbpf opens only with CAP_SYS_ADMIN (as root
# they load on 6.1, 6.12 and sid), so a raw tracepoint variant: jbd2_credit_wait_legacy on
# ext4_journal_start (gone in 6.2), jbd2_credit_wait_raw on the 6.2+ ext4_journal_start_sb/_inode.
EXPECTED_CONFIGS = {
    "5.10": "block_io_immediate,jbd2_credit_wait_legacy",
    "6.1": "block_io,jbd2_credit_wait_legacy",
    "6.12": "block_io,jbd2_credit_wait_raw",
    "sid": "block_io,jbd2_credit_wait_raw",
}
# The snapshot's stack in the guest (vgcreate makes nvme0n1 a PV: each LVM command costs seconds under TCG)
SNAPSHOT_SETUP = f"""set -e
vgcreate -q vg0 /dev/nvme0n1
lvcreate -q -y -L 512M -n lv vg0
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0,nodiscard /dev/vg0/lv
mkdir -p {MNT_ORIGIN} {MNT_SNAP}
mount /dev/vg0/lv {MNT_ORIGIN}
dd if=/dev/zero of={MNT_ORIGIN}/data bs=1M count={DATA_MIB} conv=fsync status=none
umount {MNT_ORIGIN}
lvcreate -q -y -s -c {{chunk}} -L 256M -n snap vg0/lv
mount /dev/vg0/snap {MNT_SNAP}
"""
# A live origin's writes since the snapshot was taken, beyond the file (its last 112 MiB): each
# 4 KiB chunk copied to the COW store, which ends ~44 % used (the doctor's COW finding from 40 %)
COW_MIB = 112
ORIGIN_WRITES = f"dd if=/dev/zero of=/dev/vg0/lv bs=1M seek={512 - COW_MIB} count={COW_MIB} oflag=direct status=none"
# A synchronous writer on its own small ext4 (a loop device on the guest's tmpfs, not nvme0n1):
# every 4 KiB write starts a jbd2 handle, so the credit-wait histogram counts on every kernel
JBD2_IMAGE, JBD2_MNT = "/tmp/blockstack-jbd2.img", "/tmp/blockstack-jbd2"
JBD2_WRITES = (
    f"set -e; modprobe loop; truncate -s 64M {JBD2_IMAGE}; dev=$(losetup -f --show {JBD2_IMAGE}); "
    f"mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0,nodiscard $dev; mkdir -p {JBD2_MNT}; "
    f"mount $dev {JBD2_MNT}; dd if=/dev/zero of={JBD2_MNT}/sync bs=4k count=300 oflag=dsync status=none; "
    f"echo ${{dev#/dev/}}"
)
# Buffered reads of the file through the snapshot, from the device every pass
SNAPSHOT_READS = (
    f"while :; do echo 1 > /proc/sys/vm/drop_caches; "
    f"dd if={MNT_SNAP}/data of=/dev/null bs=1M status=none; done"
)
# Two services read the file through the snapshot at once, each in its own cgroup (v2, which
# virtme-ng mounts, the io and memory controllers enabled), at 3:1 by fio's own rate limits: the
# collapse page names both in that proportion. Direct reads, from the device every pass.
CGROUPS = "/sys/fs/cgroup"
READERS = {"db.service": "1200k", "backup.service": "400k"}
CGROUP_SETUP = (
    f"echo '+io +memory' > {CGROUPS}/cgroup.subtree_control && "
    f"mkdir -p {' '.join(f'{CGROUPS}/{name}' for name in [*READERS, 'writer.service'])}"
)


def in_cgroup(name, cmd):
    """A guest shell command that runs cmd in cgroup `name`."""
    return f"echo $$ > {CGROUPS}/{name}/cgroup.procs && exec {cmd}"


def snapshot_reader(name):
    return in_cgroup(
        name,
        f"fio --name={name} --filename={MNT_SNAP}/data --rw=read --bs=1M --direct=1 "
        f"--rate={READERS[name]} --time_based --runtime=7200 --status-interval=5 "
        "--output-format=json",
    )


# Buffered writes by writer.service to the jbd2 loop device's ext4, flushed by the kernel's
# writeback (a `sync` from the root cgroup): the block cgroup charges them to writer.service.
WRITEBACK_MIB = 16
WRITEBACK = in_cgroup(
    "writer.service",
    f"dd if=/dev/zero of={JBD2_MNT}/writeback bs=1M count={WRITEBACK_MIB} status=none",
)


@dataclasses.dataclass
class Timing:
    """Phases of the NVMe incident, seconds. The healthy watch starts when Prometheus sees the
    reads on nvme0n1 (its rate windows full)."""

    scrape_interval: str = "5s"  # `make up`'s
    healthy: float = 180  # nomerges=0 under snapshot reads: no page
    page_timeout: float = 150  # nomerges=2 -> the page (TCG: the exporters are ~10x slower)
    linger: float = 20  # after the page: a second one would show up here
    lineup_timeout: float = 180


@dataclasses.dataclass
class Outcome:
    kernel: str
    release: str
    boot_seconds: float = None
    healthy_seconds: float = 0.0  # watched at nomerges=0 under reads
    healthy_pages: list = dataclasses.field(default_factory=list)
    page_seconds: float = None  # nomerges 0 -> 2 to the page at the receiver
    pages: list = dataclasses.field(default_factory=list)  # every firing page after the onset
    facts: dict = dataclasses.field(default_factory=dict)  # what the exporters reported
    configs: str = ""  # the ebpf_exporter configs the kernel loads (select-configs.sh)
    ebpf_status: dict = dataclasses.field(default_factory=dict)  # {set: (config, {variant: error})}
    healthy_lineup: dict = dataclasses.field(default_factory=dict)
    sick_lineup: dict = dataclasses.field(default_factory=dict)
    doctor: dict = dataclasses.field(
        default_factory=dict
    )  # "healthy"/"sick" -> (exit status, JSON report)
    fio_shares: dict = dataclasses.field(default_factory=dict)  # {cgroup: share of bytes read}
    phases: dict = dataclasses.field(default_factory=vm.Phases)  # seconds per phase after the boot


def build_snapshot(guest, chunk="4k"):
    """The NVMe incident's stack in the guest (SNAPSHOT_SETUP); {layer: dm-N} by LVM name."""
    guest.run(SNAPSHOT_SETUP.format(chunk=chunk), timeout=900)
    return dm_names(guest)


def dm_names(guest):
    """{dm name: dm-N} of every device-mapper device in the guest."""
    out = guest.run("for d in /sys/block/dm-*; do echo ${d##*/} $(cat $d/dm/name); done").stdout
    return {name: dev for dev, name in (line.split() for line in out.splitlines())}


def host_stack(guest, workdir, timing, servers=SERVERS):
    """The servers' configuration on the host (vm.HostStack), scraping at the timing's interval."""
    return vm.HostStack(
        guest,
        workdir,
        servers=servers,
        scrape_interval=timing.scrape_interval,
        evaluation_interval=timing.scrape_interval,
    )


@contextlib.contextmanager
def serving(stack):
    """A vm.HostStack's servers (Prometheus with the project's rules, Alertmanager, the receiver,
    ...) running on the host and scraping the guest's exporters, every target up; yields its
    StackView. Stopped on exit."""
    missing = stack.missing()
    if missing:
        raise RuntimeError("the VM lab's stack needs: " + "; ".join(missing))
    with stack.running(timeout=120):
        view = StackView.from_stack(stack)
        view.prometheus.wait_targets_up(timeout=180)
        yield view


def firing_pages(view, since):
    """The pages (receiver /page, firing) received since `since` (Unix seconds)."""
    return [n for n in view.notifications(since) if n.path == "/page" and n.status == "firing"]


def latest(view, metric, selector=""):
    """The series of an exporter's metric as of the guest's last scrape that had them (within a
    minute): under TCG on a busy machine a scrape can end at its deadline before a collector
    (dmsetup) is done, and an instant query right after it finds nothing."""
    sel = ",".join(x for x in (f'host="{view.host}"', selector) if x)
    return view.prometheus.query(f"last_over_time({metric}{{{sel}}}[1m])")


def exporter_facts(view):
    """What the exporters in the guest report of the snapshot stack, through Prometheus."""

    def by_device(metric):
        return {r["metric"]["device"]: float(r["value"][1]) for r in latest(view, metric)}

    info = {
        r["metric"]["device"]: r["metric"]
        for r in latest(view, "blockstack_device_info", 'kind="dm"')
    }
    edges = sorted(
        (r["metric"]["device"], r["metric"]["lower"])
        for r in latest(view, "blockstack_device_lower_info")
    )
    return {
        "dm": {
            dev: {k: m.get(k, "") for k in ("name", "vg_name", "lv_name", "lv_layer")}
            for dev, m in info.items()
        },
        "edges": edges,
        "snapshot": [r["metric"] for r in latest(view, "blockstack_dm_snapshot_info")],
        "chunk_bytes": by_device("blockstack_dm_snapshot_chunk_size_bytes"),
        "cow_used_bytes": by_device("blockstack_dm_snapshot_cow_used_bytes"),
        "cow_size_bytes": by_device("blockstack_dm_snapshot_cow_size_bytes"),
    }


def scrape_health(view, seconds=3600):
    """How complete the guest's blockstack-exporter scrapes were over the last `seconds`: scrapes,
    scrapes that carried the snapshot's info series, the longest scrape, the collectors' errors by
    reason (a collector past its share of the 4.5 s deadline skips the rest: under TCG, dmsetup)."""
    p, sel, w = view.prometheus, f'host="{view.host}"', f"{int(seconds)}s"
    return {
        "scrapes": p.value(f'sum(count_over_time(up{{{sel},job="blockstack"}}[{w}]))', 0.0),
        "up": p.value(f'sum(sum_over_time(up{{{sel},job="blockstack"}}[{w}]))', 0.0),
        "with_snapshot_info": p.value(
            f"max(count_over_time(blockstack_dm_snapshot_info{{{sel}}}[{w}]))", 0.0
        ),
        "longest_seconds": p.value(
            f'max(max_over_time(scrape_duration_seconds{{{sel},job="blockstack"}}[{w}]))', 0.0
        ),
        "errors": {
            f"{r['metric'].get('collector')}/{r['metric'].get('reason')}": float(r["value"][1])
            for r in p.query(f"blockstack_collector_errors_total{{{sel}}}")
        },
    }


def counter_increase(view, metric, device, seconds):
    """increase() of an ebpf_exporter counter on `device` over the last `seconds`: its series carry
    the device number (devno), named through the rules' device map."""
    return view.prometheus.value(
        f"sum(increase({metric}[{int(seconds)}s]) * on (host, devno) group_left (device)"
        f' host_devno:blockstack_device:info{{device="{device}"}})',
        0.0,
    )


def counter_value(view, metric, device):
    """An ebpf_exporter counter's value on `device` (a device the scenario made: all its counts are
    the scenario's), named through the rules' device map as counter_increase does."""
    return view.prometheus.value(
        f'sum({metric} * on (host, devno) group_left (device) host_devno:blockstack_device:info{{device="{device}"}})',
        0.0,
    )


def nvme_incident(guest, workdir, timing=None, healthy=True, say=print):
    """The NVMe incident on a booted guest (vm.Guest with nvme >= 1): the snapshot stack, the
    exporters in the guest, the servers on the host; `healthy` seconds (timing.healthy) at
    nomerges=0 under snapshot reads, then nomerges=2 until the page. blockstack-doctor runs in
    the guest once in each state (Outcome.doctor). An Outcome."""
    t = timing or Timing()
    out = Outcome(guest.kernel_name, guest.release, guest.boot_seconds)
    phases = out.phases
    dm = snapshot_with_origin_writes(guest, say)
    snap = dm["vg0-snap"]
    phases.end("setup")
    # nomerges=0: blockstack-doctor meanwhile (a minute or more in the guest on a busy machine)
    doctor = guest.start_doctor()
    with contextlib.ExitStack() as running:
        running.enter_context(guest.exporters())
        phases.end("exporters")
        view = running.enter_context(serving(host_stack(guest, workdir, t)))
        phases.end("servers")
        readers = {n: running.enter_context(guest.background(snapshot_reader(n))) for n in READERS}
        observe_healthy_reads(guest, view, out, t, snap, say)
        observe_writeback(guest, view, out, say)
        phases.end("reads seen")
        if healthy:
            hold_healthy(view, out, t, dm, snap, say)
        out.doctor["healthy"] = guest.doctor(job=doctor)
        say(f"vm: blockstack-doctor at nomerges=0: {doctor_summary(out.doctor['healthy'])}")
        phases.end("healthy")
        onset = time.time()
        guest.write_sysfs("nvme0n1", "queue/nomerges", 2)
        say("vm: nvme0n1 nomerges 0 -> 2")
        # while the page comes, as the page's doctor line says: the lineup over 5 s and the
        # guest's ebpf_exporter's counts, so it names the collapse the page names
        doctor = guest.start_doctor(
            "--interval",
            "5",
            "--ebpf",
            f"http://{vm.GUEST_ADDRESS}:{vm.EXPORTER_PORTS['ebpf']}/metrics",
        )
        hit = procs.wait_until(
            "the collapse page on nvme0n1",
            lambda: collapse_pages(view, onset),
            t.page_timeout,
            interval=1,
        )
        out.page_seconds = hit[0].received_at - onset
        say(
            f"vm: +{out.page_seconds:.0f}s PAGE {hit[0].alertname} on {hit[0].device}: "
            f"{hit[0].annotations.get('summary')}"
        )
        say(f"    description: {' '.join(hit[0].annotations.get('description', '').split())}")
        out.fio_shares = fio_shares(readers)
        say(f"vm: fio's bytes read per cgroup: {out.fio_shares}")
        phases.end("page")
        time.sleep(t.linger)
        observe_collapse(guest, view, out, doctor, onset, dm, snap, say)
        phases.end("linger")
    phases.end("stop")
    return out


def snapshot_with_origin_writes(guest, say):
    """The BPF configs probed (vm.Guest.settle_ebpf_configs), then the snapshot stack and
    ORIGIN_WRITES; {LVM name: dm-N}."""
    guest.settle_ebpf_configs()
    dm = build_snapshot(guest)
    guest.run(ORIGIN_WRITES, timeout=600)
    guest.run(CGROUP_SETUP)
    say(
        f"vm: vg0/lv (ext4, {DATA_MIB} MiB file) and vg0/snap (4 KiB chunks) on nvme0n1, "
        f"{COW_MIB} MiB written to the origin since: "
        + ", ".join(f"{n}={d}" for n, d in sorted(dm.items()))
    )
    return dm


def observe_healthy_reads(guest, view, out, t, snap, say):
    """Into out: the healthy lineup once Prometheus has the snapshot's reads, the exporters' facts,
    the BPF configs and their status, the jbd2 credit waits of 300 synchronous writes."""

    def reads_seen():
        lineup = view.lineup(["nvme0n1", snap])
        return lineup if "read" in lineup.get("nvme0n1", {}) else None

    out.healthy_lineup = procs.wait_until(
        "snapshot reads on nvme0n1 in Prometheus", reads_seen, t.lineup_timeout, interval=2
    )
    # dmsetup in the guest on a busy machine often outlasts the scrape's deadline: wait for a
    # scrape that had the snapshot's status
    procs.wait_until(
        "the snapshot's COW use in Prometheus",
        lambda: latest(view, "blockstack_dm_snapshot_cow_used_bytes"),
        240,
        interval=2,
    )
    out.facts = exporter_facts(view)
    out.configs, out.ebpf_status = guest.ebpf_configs(), guest.ebpf_status()
    jbd2_dev = out.facts["jbd2_dev"] = guest.run(JBD2_WRITES, timeout=300).stdout.split()[-1]
    writes_done = time.time()  # the host's clock, Prometheus' (the programs count as dd writes)

    def jbd2_waits():
        # from a scrape of ebpf_exporter that began after the writes ended: an earlier one can
        # hold a count taken while dd was still writing (96 of 300 on 5.10 under load)
        scraped = view.prometheus.value(
            f'max(timestamp(ebpf_exporter_jbd2_credit_wait_seconds_count{{host="{view.host}"}}))',
            0.0,
        )
        if scraped <= writes_done:
            return None
        return counter_value(view, "ebpf_exporter_jbd2_credit_wait_seconds_count", jbd2_dev)

    out.facts["jbd2_waits"] = (
        procs.wait_until(
            f"jbd2 credit waits on {jbd2_dev} in Prometheus", jbd2_waits, 60, interval=2
        )
        if "jbd2" in out.configs
        else 0.0
    )
    say(
        f"vm: configs {out.configs or 'none'}; "
        f"{out.facts['jbd2_waits']:.0f} jbd2 credit waits counted on "
        f"{jbd2_dev} (300 synchronous writes)"
    )
    say(f"vm: healthy lineup (nomerges=0): {_lineup(out.healthy_lineup)}")


def hold_healthy(view, out, t, dm, snap, say):
    """t.healthy seconds at nomerges=0, the pages and alerts said every 15 s; into out: the pages,
    the seconds held, the missed merges and splits of the last minute."""
    start = time.time()
    while time.time() - start < t.healthy:
        time.sleep(min(15, max(0.0, t.healthy - (time.time() - start))))
        out.healthy_pages = firing_pages(view, start - 60)
        alerts = view.alerts(["nvme0n1", *dm.values()])
        say(
            f"vm: +{time.time() - start:.0f}s nomerges=0: "
            f"{_lineup(view.lineup(['nvme0n1', snap]))}; "
            f"alerts: {alerts or 'none'}; pages: {len(out.healthy_pages)}"
        )
    out.healthy_seconds = time.time() - start
    out.facts["missed_merges_healthy"] = counter_increase(
        view, "ebpf_exporter_block_rq_missed_merges_total", "nvme0n1", 60
    )
    out.facts["splits_healthy"] = counter_increase(
        view, "ebpf_exporter_block_bio_splits_total", snap, 60
    )


def observe_collapse(guest, view, out, doctor, onset, dm, snap, say):
    """Into out, after the page: the doctor's sick run, the pages, the sick lineup, the missed
    merges and splits since the onset (at most a minute), the scrapes' health."""
    out.doctor["sick"] = guest.doctor(job=doctor)
    say(f"vm: blockstack-doctor at nomerges=2: {doctor_summary(out.doctor['sick'])}")
    out.pages = firing_pages(view, onset)
    out.sick_lineup = view.lineup(["nvme0n1", snap])
    seconds = max(time.time() - onset, 30)
    out.facts["missed_merges_sick"] = counter_increase(
        view, "ebpf_exporter_block_rq_missed_merges_total", "nvme0n1", min(seconds, 60)
    )
    out.facts["splits_sick"] = counter_increase(
        view, "ebpf_exporter_block_bio_splits_total", snap, min(seconds, 60)
    )
    out.facts["dm_names"] = dm
    say(f"vm: sick lineup (nomerges=2): {_lineup(out.sick_lineup)}")
    out.facts["scrapes"] = scrape_health(view)


def observe_writeback(guest, view, out, say):
    """Into out.facts["writeback"]: {cgroup: bytes written} to the jbd2 loop device while
    writer.service's buffered writes are flushed by a sync from the root cgroup."""
    query = (
        "sum by (cgroup) (last_over_time(ebpf_exporter_block_cgroup_bio_bytes_total"
        f'{{host="{view.host}",operation="write"}}[1m])'
        " * on (devno, cgroup_id) group_left (cgroup) max by (devno, cgroup_id, cgroup)"
        " (ebpf_exporter_block_cgroup_admissions_total)"
        " * on (devno) group_left () max by (devno) (blockstack_device_number_info"
        f'{{device="{out.facts["jbd2_dev"]}"}}))'
    )

    def written():
        return {
            r["metric"].get("cgroup"): float(r["value"][1]) for r in view.prometheus.query(query)
        }

    before = written()
    guest.run(WRITEBACK, timeout=300)
    guest.run("sync", timeout=300)

    def grown():
        now = written()
        delta = {c: n - before.get(c, 0.0) for c, n in now.items()}
        return delta if delta.get("writer.service", 0) >= WRITEBACK_MIB << 20 else None

    try:
        out.facts["writeback"] = procs.wait_until("writer.service's writeback", grown, 60, 2)
    except TimeoutError:
        now = written()
        out.facts["writeback"] = {c: n - before.get(c, 0.0) for c, n in now.items()}
    say(f"vm: bytes written to {out.facts['jbd2_dev']} by cgroup: {out.facts['writeback']}")


def fio_shares(readers):
    """{cgroup: share of the bytes the readers read} from each fio's last JSON status."""
    read = {}
    for name, job in readers.items():
        output = job.poll()[1]
        start = output.rfind("{", 0, output.rfind('"fio version"'))
        status = json.JSONDecoder().raw_decode(output[start:])[0]
        read[name] = status["jobs"][0]["read"]["io_bytes"]
    total = sum(read.values()) or 1
    return {name: n / total for name, n in read.items()}


def collapse_pages(view, onset):
    """The collapse pages on nvme0n1 received since onset."""
    return [
        n
        for n in firing_pages(view, onset)
        if n.alertname == "BlockStackMergeCollapse" and n.device == "nvme0n1"
    ]


def doctor_summary(doctor):
    """A line of a blockstack-doctor run (Guest.doctor): its exit status and findings."""
    rc, report = doctor
    return f"exit {rc}; " + "; ".join(
        f"{f['severity']} {f['check']} on {report['devices'][f['device']]['label']}: {f['what']}"
        for f in report["findings"]
    )


@contextlib.contextmanager
def nvme_collapse(
    guest, workdir, healthy=60, settle=25, timing=None, servers=(*SERVERS, "grafana"), say=print
):
    """The NVMe incident held open for a look at it (the dashboard screenshot): the snapshot stack,
    the exporters in the guest, `servers` on the host (Grafana too by default), `healthy` seconds
    of snapshot reads at nomerges=0 once Prometheus sees them, then nomerges=2 until the collapse
    page on nvme0n1, `settle` seconds more (the recording rules' windows full of the collapse).
    Yields a namespace: stack, view, dm ({LVM name: dm-N}), snap (dm-N), start (the reads seen,
    Unix seconds), onset, paged. The reads go on until the context exits."""
    t = timing or Timing()
    guest.settle_ebpf_configs()
    dm = build_snapshot(guest)
    snap = dm["vg0-snap"]
    say(
        "vm: vg0/snap (4 KiB chunks) over nvme0n1: "
        + ", ".join(f"{n}={d}" for n, d in sorted(dm.items()))
    )
    stack = host_stack(guest, workdir, t, servers)
    with guest.exporters(), serving(stack) as view, guest.background(SNAPSHOT_READS):
        procs.wait_until(
            "snapshot reads on nvme0n1 in Prometheus",
            lambda: "read" in view.lineup(["nvme0n1"]).get("nvme0n1", {}),
            t.lineup_timeout,
            interval=5,
        )
        start = time.time()
        say(
            f"vm: healthy (nomerges=0) for {healthy:.0f} s: {_lineup(view.lineup(['nvme0n1', snap]))}"
        )
        time.sleep(healthy)
        onset = time.time()
        guest.write_sysfs("nvme0n1", "queue/nomerges", 2)
        say("vm: nvme0n1 nomerges 0 -> 2")
        hit = procs.wait_until(
            "the collapse page on nvme0n1",
            lambda: collapse_pages(view, onset),
            t.page_timeout,
            interval=1,
        )
        paged = hit[0].received_at
        say(
            f"vm: +{paged - onset:.0f}s PAGE {hit[0].alertname} on {hit[0].device}; "
            f"sick: {_lineup(view.lineup(['nvme0n1', snap]))}"
        )
        time.sleep(settle)
        yield types.SimpleNamespace(
            stack=stack, view=view, dm=dm, snap=snap, start=start, onset=onset, paged=paged
        )


def _lineup(lineup):
    return (
        "; ".join(
            f"{dev} "
            + ", ".join(
                f"{op} {rate:.0f}/s x {size:.1f} sectors" for op, (rate, size) in ops.items()
            )
            for dev, ops in sorted(lineup.items())
        )
        or "idle"
    )


def run(kernel, healthy=True, timing=None, say=print):
    """Boot `kernel`, run the NVMe incident, tear down; an Outcome."""
    with (
        tempfile.TemporaryDirectory(prefix="blockstack-vm-stack-") as workdir,
        vm.Guest(kernel, nvme=1, say=vm.say) as g,
    ):
        return nvme_incident(g, workdir, timing, healthy, say)


def main(argv=None):
    ap = argparse.ArgumentParser(description="The NVMe incident on Debian's kernels in the VM lab")
    ap.add_argument("kernels", nargs="*", default=list(EXPECTED_CONFIGS))
    ap.add_argument("--healthy-seconds", type=float, default=Timing.healthy)
    args = ap.parse_args(argv)
    if not vm.ready(args.kernels):
        return 2
    rows, ok = [], True
    for k in args.kernels:
        o = run(k, timing=Timing(healthy=args.healthy_seconds), say=vm.say)
        good = not o.healthy_pages and o.page_seconds is not None and len(o.pages) == 1
        good &= o.configs == EXPECTED_CONFIGS.get(k, o.configs)
        ok &= good
        rows.append(
            f"| NVMe incident (LVM snapshot 4 KiB chunks on nvme0n1) | {o.release} | {o.configs or 'none'} | page "
            f"BlockStackMergeCollapse on nvme0n1 at nomerges=2, none at 0 | "
            f"{'; '.join(f'{p.alertname} on {p.device}' for p in o.pages) or 'no page'}"
            f"{'; healthy: ' + ', '.join(p.alertname for p in o.healthy_pages) if o.healthy_pages else ''} | "
            f"{o.page_seconds:.0f} | {o.healthy_seconds / 60:.1f} | boot {o.boot_seconds:.0f} s |"
        )
    print(
        "\n| scenario | kernel | configs | expected | observed | onset→page s | healthy min watched | |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
