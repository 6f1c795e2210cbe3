#!/usr/bin/env python3
"""Cost of the BPF programs on a loop device: their own run time per I/O next to upstream
ebpf_exporter's examples/biolatency, and fio 4 KiB random-read IOPS with all of ours vs none.

    make bench-ebpf        (or: .venv/bin/python ebpf-configs/bench/bench_overhead.py [--rounds N])

A benchmark, not a test: it prints figures and asserts nothing. Needs root, fio, `make ebpf-build`
(and builds upstream's biolatency with `make -C ebpf-configs upstream`).

1. BPF run time per I/O (kernel.bpf_stats_enabled=1, restored after): in the same run, on one
   direct-io loop device, interleaved: no programs, upstream's examples/biolatency (its .bpf.c and
   .yaml from the ebpf_exporter v2.5.1 module in Go's module cache), every config of ours this
   kernel loads. Figures: the programs' total run time / fio's I/Os, runs per I/O, and per
   program ns per run. Goal: ours <= 0.5x upstream biolatency per I/O.
2. IOPS with/without ours (goal >= 0.98), on two loop devices, because the overhead is a fixed
   CPU cost per I/O and its share depends on what an I/O costs otherwise:
     page-cache  loop over a file in the page cache: an I/O is a few microseconds of CPU and
                 nothing else, the worst case (few real devices complete 4 KiB reads this cheaply);
     direct-io   loop with --direct-io=on over a file on the root filesystem's disk: each I/O
                 reaches a real device, like the disks this stack watches.
   Beside none and ours: none again (an A/A pair: what the method resolves) and empty programs
   on our hooks (bench/floor.bpf.c: what running any program there costs, the part no change
   inside ours can remove). Runs are interleaved, the order rotated each round, so drift and
   neighbours' load spread over every side, and each follows a 1 s ramp that fio leaves out; the
   figures are the medians of the per-round ratios to none.
3. The BPF share of the CPU a read takes (goal <= 2 %, what IOPS >= 0.98 asks of a CPU-bound
   read), on both loops: `perf record -a -g` samples during a run each of the floor, upstream's
   biolatency and ours, interleaved; the share is the I/O path's samples (fio, kernel workers,
   interrupts; not idle, not other processes) with a BPF program in their stack. Unlike the IOPS
   ratio it does not move with where the scheduler puts the loop's worker, so a run resolves a
   fraction of a per cent. Needs perf (Debian's linux-perf); skipped without it.

Ours run as users run them (default): select-configs.sh probes the variants and our
ebpf_exporter runs under the identity the Debian package, `make up` as root and the Helm chart
give it (deploy/blockstack_deploy/privileges.py: its own user, CAP_BPF and CAP_PERFMON through
setpriv, no CAP_SYS_ADMIN; every capability dropped once attached, --capabilities.keep as
stack.py passes it), at the kernel's kernel.perf_event_paranoid as it is (Debian's kernels: 3,
which refuses that identity a CPU-wide perf event). Upstream's biolatency and the floor run as
root, as upstream's example is run. --as-root runs ours as root too (what it measured before).
The header names the identity, the paranoid level and the variants chosen; --summary FILE
writes the figures as JSON (lab/bench/bench_kernels.py reads it from its guests).
"""

import argparse
import contextlib
import ctypes
import dataclasses
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time

from prometheus_client.parser import text_string_to_metric_families

from blockstack_deploy import privileges
from blockstack_deploy.stack import ebpf_keep_capabilities
from blockstack_lab import fio, loop
from blockstack_testsupport import procs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, ".build"))
EXPORTER = os.path.join(BUILD, "bin", "ebpf_exporter")
CONFIG_DIR = os.path.join(BUILD, "ebpf-configs")
SELECT = os.path.join(ROOT, "ebpf-configs", "select-configs.sh")
UPSTREAM_DIR = os.path.join(BUILD, "ebpf-upstream")  # make -C ebpf-configs upstream
BPF_STATS = "/proc/sys/kernel/bpf_stats_enabled"
PARANOID = "/proc/sys/kernel/perf_event_paranoid"

# Programs on the block tracepoints a read passes through (someone else's would skew the figures).
BLOCK_PROGRAMS = {"block_bio_queue", "block_rq_insert", "block_rq_issue", "block_rq_complete"}
# Programs run by a timer, not by I/O (block_io's per-CPU flush): counted as their whole run time
# over a run divided by the run's I/Os.
# (a perf_event program until 2026-11-27, a BPF timer's callback since: flush_costs())
TIMER_PROGRAMS = {"flush_pending"}

# 4 KiB random direct reads, one job, queue depth 16 (blockstack_lab.fio.RANDOM_4K_READ).
WORKLOAD = fio.RANDOM_4K_READ


def run_fio(dev, runtime, ramp=0):
    """fio's IOPS over `runtime` seconds, after `ramp` seconds it leaves out."""
    return fio.iops(
        fio.run(
            [f"--filename={dev}", *WORKLOAD, f"--ramp_time={ramp}"],
            runtime=runtime,
            name="bench-ebpf",
        )
    )


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who an ebpf_exporter of the benchmark runs as: a command prefix (setpriv) and the flags
    that go with it; root by default."""

    name: str = "root"
    prefix: tuple = ()
    flags: tuple = ()


ROOT_IDENTITY = Identity()


def production_identity():
    """ebpf_exporter's identity in production (privileges.py, as `make up` as root, the Debian
    package and the Helm chart give it): its user made if missing (privileges.ensure_users, as
    the package does), its capabilities through setpriv (the prefix stack.py gives
    select-configs.sh in SELECT_CONFIGS_AS), every one dropped once the programs are attached
    (stack.ebpf_keep_capabilities, stack.py's --capabilities.keep)."""
    if not privileges.enabled():
        sys.exit("ebpf_exporter's own user needs root to switch to: run as root, or --as-root")
    privileges.ensure_users()
    user, _, caps = privileges.identity("ebpf")
    keep = f"--capabilities.keep={ebpf_keep_capabilities(os.uname().release)}"
    return Identity(
        f"{user} ({', '.join('CAP_' + c.upper() for c in caps)}; {keep})",
        tuple(privileges.wrap("ebpf", [])),
        (keep,),
    )


def read_sysctl(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def select_configs(identity):
    """(select-configs.sh's choice, its warnings: why variants before it did not load), probed
    under `identity` (SELECT_CONFIGS_AS)."""
    r = subprocess.run(
        [SELECT, EXPORTER, CONFIG_DIR],
        check=True,
        capture_output=True,
        text=True,
        timeout=3600,
        env=dict(os.environ, SELECT_CONFIGS_AS=" ".join(identity.prefix)),
    )
    return r.stdout.strip(), [line for line in r.stderr.splitlines() if line.strip()]


def rotated(sides, i):
    """The sides in round i's order: each round starts one later, so drift spreads over all."""
    order = list(sides)
    return order[i % len(order) :] + order[: i % len(order)]


@contextlib.contextmanager
def exporter(names, config_dir=CONFIG_DIR, identity=ROOT_IDENTITY):
    port = procs.free_port()
    argv = [
        *identity.prefix,
        EXPORTER,
        f"--config.dir={config_dir}",
        f"--config.names={names}",
        *identity.flags,
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    url = f"http://127.0.0.1:{port}/metrics"
    with procs.running(argv, env={"OTEL_TRACES_EXPORTER": "none"}, health_url=url, timeout=60):
        time.sleep(1)  # let the exporter finish starting (BTF parsing, GC) before measuring
        yield url


@contextlib.contextmanager
def device(mode, size):
    if mode == "page-cache":
        with loop.attached(size) as dev:
            yield dev
        return
    # O_DIRECT needs a filesystem that supports it (not tmpfs), and holes would be read as zeros
    # without touching the disk, so the file is written in full first.
    with loop.attached(size, directory="/var/tmp", direct_io=True) as dev:
        subprocess.run(
            [
                "dd",
                "if=/dev/zero",
                f"of={dev}",
                "bs=1M",
                f"count={size >> 20}",
                "oflag=direct",
                "status=none",
            ],
            check=True,
            timeout=300,
        )
        yield dev


def compare(mode, names, rounds, runtime, size, ours_as=ROOT_IDENTITY):
    """IOPS with no programs (twice: the second run, "none again", shows what the method resolves),
    with empty programs on our hooks (the floor: what any program there costs) and with ours
    (as `ours_as`), interleaved, the order rotated each round; every run after a 1 s ramp that fio
    leaves out, so that an exporter just started weighs on no figure. Returns {side: ratio to none}."""
    sides = {
        "none": None,
        "none again": None,
        "floor": (UPSTREAM_DIR, "floor", ROOT_IDENTITY),
        "ours": (CONFIG_DIR, names, ours_as),
    }
    iops = {side: [] for side in sides}
    with device(mode, size) as dev:
        run_fio(dev, 1)  # warm caches and CPU frequency
        for i in range(rounds):
            for side in rotated(sides, i):
                if sides[side] is None:
                    value = run_fio(dev, runtime, ramp=1)
                else:
                    config_dir, config_names, identity = sides[side]
                    with exporter(config_names, config_dir, identity):
                        value = run_fio(dev, runtime, ramp=1)
                iops[side].append(value)
                print(f"  {mode} round {i + 1}/{rounds} {side:>10}: {value:10.0f} IOPS", flush=True)
    # Each round's runs are seconds apart, so their ratios are the least disturbed by drift.
    ratios = {
        side: statistics.median(w / wo for w, wo in zip(iops[side], iops["none"]))
        for side in list(sides)[1:]
    }
    print(
        f"{mode}: IOPS ratio to none (median of {rounds} interleaved rounds): ours {ratios['ours']:.3f} "
        f"(goal >= 0.98), floor (empty programs on our hooks) {ratios['floor']:.3f}, none again "
        f"{ratios['none again']:.3f} (the method's own spread); medians "
        + ", ".join(f"{side} {statistics.median(v):.0f}" for side, v in iops.items()),
        flush=True,
    )
    return ratios


def loads(config_dir, names, identity=ROOT_IDENTITY):
    """Whether ebpf_exporter loads and attaches `names` from `config_dir` on this kernel, run as
    `identity`."""
    r = subprocess.run(
        [
            *identity.prefix,
            EXPORTER,
            f"--config.dir={config_dir}",
            f"--config.names={names}",
            "--config.check",
            "--config.strict",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OTEL_TRACES_EXPORTER="none"),
    )
    if r.returncode:
        print(
            f"  {names} does not load here as {identity.name}: "
            f"{(r.stdout + r.stderr).strip().splitlines()[-1:]}",
            flush=True,
        )
    return r.returncode == 0


def foreign_programs():
    """BPF programs already attached to the block tracepoints by someone else (another
    ebpf_exporter, bpftrace): they run in the 'without' runs too and shrink the difference."""
    progs = json.loads(
        subprocess.run(
            ["bpftool", "-j", "prog", "show"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    return [
        f"{p['id']}:{p.get('name')}"
        for p in progs
        if p.get("type") in ("tracing", "raw_tracepoint") and p.get("name") in BLOCK_PROGRAMS
    ]


def program_ids(url):
    """Ids of the exporter's programs, from its ebpf_exporter_ebpf_program_info metric."""
    return {
        int(s.labels["id"]): f"{s.labels['config']}:{s.labels['program']}"
        for family in text_string_to_metric_families(procs.http_get(url))
        for s in family.samples
        if s.name == "ebpf_exporter_ebpf_program_info"
    }


def prog_stats(ids):
    """{program id: (run_cnt, run_time_ns)} of the given program ids."""
    progs = json.loads(
        subprocess.run(
            ["bpftool", "-j", "prog", "show"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    return {
        p["id"]: (p.get("run_cnt", 0), p.get("run_time_ns", 0)) for p in progs if p["id"] in ids
    }


@contextlib.contextmanager
def bpf_stats_enabled():
    """kernel.bpf_stats_enabled=1 for the block, restored to its previous value after."""
    with open(BPF_STATS) as f:
        old = f.read().strip()
    with open(BPF_STATS, "w") as f:
        f.write("1")
    try:
        yield
    finally:
        with open(BPF_STATS, "w") as f:
            f.write(old)


def scheduler(disk):
    with open(f"/sys/block/{disk}/queue/scheduler") as f:
        text = f.read()
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text.strip()


def disk_beneath(dev):
    """The whole disk holding the loop device's backing file (vda for a file on /dev/vda1)."""
    st = os.stat(loop.attached_devices()[dev])
    name = os.path.basename(
        os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    )
    if os.path.exists(f"/sys/class/block/{name}/partition"):
        name = os.path.basename(os.path.dirname(os.path.realpath(f"/sys/class/block/{name}")))
    return name


def hooks_per_io(dev, mode):
    """Tracepoint hits per fio 4 KiB random read on the device stack: one bio (block_bio_queue), one
    request issued and completed on the loop device and, for a direct-io loop, on the disk holding
    its backing file (the loop driver sends each request on as one bio); block_rq_insert where
    the device has an I/O scheduler (with `none` requests go straight to the driver). No merges
    or splits in this workload (checked against /proc/diskstats after each run)."""
    disks = [loop.name(dev)] + ([disk_beneath(dev)] if mode == "direct-io" else [])
    return disks, {
        "block_bio_queue": len(disks),
        "block_rq_issue": len(disks),
        "block_rq_complete": len(disks),
        "block_rq_insert": sum(scheduler(d) != "none" for d in disks),
    }


def diskstats_requests():
    """{device: (requests completed, merges)} for every whole disk (Documentation/admin-guide/iostats.rst)."""
    out = {}
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if os.path.exists(f"/sys/block/{fields[2]}"):
                v = [int(x) for x in fields[3:]]
                out[fields[2]] = (v[0] + v[4] + (v[11] if len(v) > 11 else 0), v[1] + v[5])
    return out


def flush_costs(ids):
    """{"config:flush_pending": (runs, ns)} of each config among the programs `ids` whose flush is a
    BPF timer callback (block_batched.bpf.h): the kernel's per-program statistics leave a callback
    out, so the flush counts its own runs and nanoseconds in its `flush_cost` map, summed here over
    the CPUs. Counted as a timer program (TIMER_PROGRAMS)."""

    def bpftool(*args):
        out = subprocess.run(
            ["bpftool", "-j", *args], check=True, capture_output=True, text=True, timeout=60
        ).stdout
        return json.loads(out)

    configs = {}
    for p in bpftool("prog", "show"):
        if p["id"] in ids:
            configs.setdefault(ids[p["id"]].split(":")[0], set()).update(p.get("map_ids", []))
    costs = {}
    for config, map_ids in configs.items():
        for map_id in map_ids:
            if bpftool("map", "show", "id", str(map_id)).get("name") != "flush_cost":
                continue
            runs = ns = 0
            for entry in bpftool("map", "dump", "id", str(map_id)):
                for per_cpu in entry.get("formatted", entry)["values"]:
                    runs += per_cpu["value"]["runs"]
                    ns += per_cpu["value"]["ns"]
            costs[f"{config}:flush_pending"] = (runs, ns)
    return costs


def cost_run(dev, side, runtime):
    """One fio run with `side`'s programs attached (none: no exporter). Returns fio's I/Os, IOPS,
    {(config, program): (runs, ns)} counted by the kernel over the run, and diskstats deltas."""
    config_dir, names, identity = side
    with exporter(names, config_dir, identity) if names else contextlib.nullcontext() as url:
        ids = program_ids(url) if url else {}
        before, disks_before = prog_stats(ids), diskstats_requests()
        flush_before = flush_costs(ids)
        report = fio.run([f"--filename={dev}", *WORKLOAD], runtime=runtime, name="bench-ebpf")
        after, disks_after = prog_stats(ids), diskstats_requests()
        flush_after = flush_costs(ids)
    ios = sum(job["read"]["total_ios"] for job in report["jobs"])
    delta = {
        ids[i]: (after[i][0] - before[i][0], after[i][1] - before[i][1])
        for i in after
        if i in before
    }
    for name, (runs, ns) in flush_after.items():
        b = flush_before.get(name, (0, 0))
        delta[name] = (runs - b[0], ns - b[1])
    # a device detached and attached again in between starts from 0: no negative counts
    disks = {
        d: (
            max(disks_after[d][0] - disks_before[d][0], 0),
            max(disks_after[d][1] - disks_before[d][1], 0),
        )
        for d in disks_after
        if d in disks_before
    }
    return ios, fio.iops(report), delta, disks


@contextlib.contextmanager
def whole_disk(name):
    """An existing whole disk (a VM lab guest's nvme0n1) as the cost runs' device: one bio, one
    request issued and completed per read, block_rq_insert only with an I/O scheduler."""
    yield f"/dev/{name}"


def disk_hooks(name):
    return [name], {
        "block_bio_queue": 1,
        "block_rq_issue": 1,
        "block_rq_complete": 1,
        "block_rq_insert": int(scheduler(name) != "none"),
    }


def bpf_cost(names, rounds, runtime, size, mode, baseline=None, disk=None, ours_as=ROOT_IDENTITY):
    """BPF run time per I/O, from the kernel's own accounting (kernel.bpf_stats_enabled), for no
    programs, upstream's examples/biolatency and all of ours (ours as `ours_as`, upstream's and the
    floor as root), in interleaved runs on one device. Returns {side: ns per I/O}.

    The kernel counts each program's runs and run time over the whole machine, other people's I/O
    included (this VM is shared), so a program's time per run is measured (median over rounds) and
    multiplied by how often one read of the workload fires its tracepoint (hooks_per_io): the cost
    of one read, independent of what else runs. The raw figure (all runs / fio's I/Os) is printed
    beside it with the share of the machine's requests that were ours."""
    sides = {
        "none": (None, None, ROOT_IDENTITY),
        "upstream biolatency": (UPSTREAM_DIR, "biolatency", ROOT_IDENTITY),
        "ours": (CONFIG_DIR, names, ours_as),
        "floor (empty programs)": (UPSTREAM_DIR, "floor", ROOT_IDENTITY),
    }
    if "block_io" in names.split(","):  # block_io alone, with and without per-cgroup attribution
        sides["block_io"] = (CONFIG_DIR, "block_io", ours_as)
        sides["block_io without cgroups"] = (UPSTREAM_DIR, "block_io_nocgroups", ours_as)
    if baseline:  # another build of our configs (e.g. main's), measured beside this one
        sides["ours, --baseline build"] = (baseline, names, ours_as)
    if (
        disk
    ):  # sides that do not load on this kernel (upstream's biolatency before 5.11) are left out
        sides = {side: v for side, v in sides.items() if v[1] is None or loads(*v)}
    results = {side: [] for side in sides}
    with whole_disk(disk) if disk else device(mode, size) as dev, bpf_stats_enabled():
        stack, hooks = disk_hooks(disk) if disk else hooks_per_io(dev, mode)
        run_fio(dev, 1)
        for i in range(rounds):
            for side in rotated(sides, i):
                ios, iops, delta, disks = cost_run(dev, sides[side], runtime)
                results[side].append((ios, iops, delta))
                ours = disks[stack[0]][0] * len(stack)
                raw = sum(d[1] for d in delta.values()) / ios
                print(
                    f"  {mode} round {i + 1}/{rounds} {side:>19}: {iops:8.0f} IOPS, raw {raw:6.0f} ns/IO "
                    f"({sum(d[0] for d in delta.values()) / ios:5.2f} runs/IO; our requests "
                    f"{ours / max(sum(r for r, _ in disks.values()), 1):.0%} of the machine's; merges on "
                    f"{stack[0]}: {disks[stack[0]][1]})",
                    flush=True,
                )
    print(
        f"{mode} loop ({' over '.join(stack)}, schedulers {', '.join(scheduler(d) for d in stack)}): "
        f"tracepoint hits per read {hooks}"
    )
    print(
        f"BPF cost per fio 4 KiB random read, median of {rounds} interleaved runs of {runtime} s "
        f"({time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.1f}):"
    )
    per_io = {}
    for side, runs_ in results.items():
        iops = statistics.median(r[1] for r in runs_)
        progs = sorted({p for r in runs_ for p in r[2]})
        ns_run = {
            p: statistics.median(r[2][p][1] / r[2][p][0] for r in runs_ if r[2].get(p, (0, 0))[0])
            for p in progs
            if any(r[2].get(p, (0, 0))[0] for r in runs_)
        }
        # a program on a timer costs its run time over the run, whatever the I/O: per I/O at this IOPS
        timer_ns = {
            p: statistics.median(r[2].get(p, (0, 0))[1] / r[0] for r in runs_)
            for p in progs
            if p.split(":")[1] in TIMER_PROGRAMS
        }
        per_io[side] = sum(ns * hooks.get(p.split(":")[1], 0) for p, ns in ns_run.items()) + sum(
            timer_ns.values()
        )
        n_runs = sum(hooks.get(p.split(":")[1], 0) for p in progs)
        print(f"  {side:19s} {iops:8.0f} IOPS  {per_io[side]:6.0f} ns/IO  {n_runs} program runs/IO")
        for p, ns in sorted(ns_run.items()):
            n = hooks.get(p.split(":")[1], 0)
            if p in timer_ns:
                runs_s = statistics.median(r[2].get(p, (0, 0))[0] / runtime for r in runs_)
                print(
                    f"      {p:45s} {ns:6.0f} ns/run, {runs_s:.0f} runs/s on a timer: {timer_ns[p]:.0f} ns/IO "
                    f"at {iops:.0f} IOPS"
                )
                continue
            print(
                f"      {p:45s} {ns:6.0f} ns/run x {n}"
                + ("" if n else "  (not on this workload's path)")
            )
    if "upstream biolatency" not in per_io:
        print(
            f"BPF run time per I/O ({mode}): ours {per_io['ours']:.0f} ns, floor (empty programs) "
            f"{per_io['floor (empty programs)']:.0f} ns; upstream biolatency does not load on this kernel",
            flush=True,
        )
        return per_io
    ratio = per_io["ours"] / per_io["upstream biolatency"]
    floor = per_io["floor (empty programs)"]
    print(
        f"BPF run time per I/O ({mode}): none 0 ns, upstream biolatency {per_io['upstream biolatency']:.0f} ns, "
        f"ours {per_io['ours']:.0f} ns: ours / upstream {ratio:.2f}x (goal <= 0.5x); includes bpf_stats' own "
        "timing, two clock reads per run",
        flush=True,
    )
    print(
        f"floor: empty programs on our tracepoints {floor:.0f} ns per I/O = "
        f"{floor / per_io['upstream biolatency']:.2f}x upstream before doing anything; ours above the floor "
        f"{per_io['ours'] - floor:.0f} ns, upstream above an empty run per hook "
        f"{per_io['upstream biolatency'] - floor * 5 / 6:.0f} ns",
        flush=True,
    )
    if "block_io without cgroups" in per_io:
        without = per_io["block_io without cgroups"]
        print(
            f"per-cgroup attribution (block_cgroups.bpf.h): block_io {per_io['block_io']:.0f} ns/IO "
            f"with it, {without:.0f} ns/IO without: +{per_io['block_io'] - without:.0f} ns/IO, "
            f"{per_io['block_io'] / without:.2f}x; upstream biolatency "
            f"{per_io['upstream biolatency']:.0f} ns/IO",
            flush=True,
        )
    return per_io


# --- the BPF share of a read's CPU, from perf's stacks -------------------------------------------
# A sample is idle when the CPU was halted (its innermost frame is an idle loop's), and on the I/O
# path when it is fio's, a kernel worker's (the loop device's), softirq's, or an interrupt's taken
# on an idle CPU (comm swapper): other processes on a shared machine are left out.
IDLE_FRAMES = ("halt", "idle", "mwait")
# Samples on the I/O path below which a share resolves nothing (one sample is 1/N of it)
MIN_SHARE_SAMPLES = 200
IO_COMMS = ("fio", "kworker/", "ksoftirqd/", "swapper")


def perf_shares(path):
    """(all samples, those on the I/O path, those of them with a BPF program in the stack) in a
    perf.data file."""
    text = subprocess.run(
        ["perf", "script", "-i", path, "-F", "comm,ip,sym"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    total = io_path = bpf = 0
    for sample in text.split("\n\n"):
        comm, *stack = sample.strip().splitlines() or [""]
        frames = [line.split(None, 1)[-1] for line in stack]  # "address symbol", innermost first
        total += bool(frames)
        if not frames or not comm.startswith(IO_COMMS) or any(f in frames[0] for f in IDLE_FRAMES):
            continue
        io_path += 1
        bpf += any(frame.startswith(("bpf_prog_", "bpf_trace_run")) for frame in frames)
    return total, io_path, bpf


def cpu_share(
    mode,
    names,
    rounds,
    runtime,
    size,
    ours_as=ROOT_IDENTITY,
    disk=None,
    data_dir=BUILD,
    frequency=1999,
):
    """The share of the I/O path's CPU spent in BPF programs (and what they call: clock reads, map
    helpers, the tracepoint's dispatch into them), for the floor, upstream's biolatency and ours
    (as `ours_as`; the others as root), interleaved: perf record -a -g during each fio run, after
    a 1 s ramp; on a loop device of `mode`, or on the existing whole disk `disk`. perf.data goes
    to `data_dir` (a guest's root is read-only); samples at `frequency` Hz per CPU. Returns
    {"share": {side: share}, "io_path_samples": {side: samples}} (medians); a side that does not
    load here (upstream's biolatency before 5.11) is left out."""
    sides = {
        "floor": (UPSTREAM_DIR, "floor", ROOT_IDENTITY),
        "upstream biolatency": (UPSTREAM_DIR, "biolatency", ROOT_IDENTITY),
        "ours": (CONFIG_DIR, names, ours_as),
    }
    if disk:
        sides = {side: v for side, v in sides.items() if loads(*v)}
    shares = {side: [] for side in sides}
    samples = {side: [] for side in sides}  # on the I/O path
    busy = []
    data = os.path.join(data_dir, "bench-ebpf.perf.data")
    with whole_disk(disk) if disk else device(mode, size) as dev:
        run_fio(dev, 1)
        for i in range(rounds):
            for side in rotated(sides, i):
                config_dir, config_names, identity = sides[side]
                with exporter(config_names, config_dir, identity):
                    with fio.background(
                        [f"--filename={dev}", *WORKLOAD], runtime=runtime + 2, name="bench-ebpf"
                    ):
                        time.sleep(1)
                        subprocess.run(
                            [
                                "perf",
                                "record",
                                "-q",
                                # no pass over the data for build ids: in a TCG guest perf record
                                # once outlasted 64 s for a 4 s window
                                "--no-buildid",
                                "-a",
                                "-g",
                                "-e",
                                "cpu-clock",
                                "-F",
                                str(frequency),
                                "-o",
                                data,
                                "--",
                                "sleep",
                                str(runtime),
                            ],
                            check=True,
                            capture_output=True,
                            timeout=runtime + 300,
                        )
                total, io_path, bpf = perf_shares(data)
                shares[side].append(bpf / max(io_path, 1))
                samples[side].append(io_path)
                busy.append(io_path / max(total, 1))
                print(
                    f"  {mode} round {i + 1}/{rounds} {side:>19}: BPF in {bpf} of {io_path} samples on the "
                    f"I/O path ({shares[side][-1]:.2%})",
                    flush=True,
                )
    os.unlink(data)
    print(
        f"{mode}: BPF share of the I/O path's CPU (median of {rounds} interleaved rounds, perf record -a -g): "
        + ", ".join(f"{side} {statistics.median(v):.2%}" for side, v in shares.items())
        + f"; the I/O path kept {statistics.median(busy):.0%} of the CPUs busy (a 2 % share is IOPS >= 0.98 "
        "where the CPU is the bottleneck, near 100 %)",
        flush=True,
    )
    fewest = min(statistics.median(v) for v in samples.values())
    if fewest < MIN_SHARE_SAMPLES:
        print(
            f"{mode}: too few samples on the I/O path to resolve a share (fewest {fewest:.0f}, wanted "
            f"{MIN_SHARE_SAMPLES}): the CPUs were idle (a VM lab guest waits for QEMU's emulated device)",
            flush=True,
        )
    return {
        "share": {side: statistics.median(v) for side, v in shares.items()},
        "io_path_samples": {side: statistics.median(v) for side, v in samples.items()},
    }


# --- scale: ns per I/O against the number of devices in the maps ---------------------------------
SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine, 321)
BPF_MAP_UPDATE_ELEM, BPF_MAP_GET_FD_BY_ID = 2, 14
FAKE_MAJOR = 4094  # no driver has it: keys of devices that do not exist
_libc = ctypes.CDLL(None, use_errno=True)


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    r = _libc.syscall(SYS_BPF, cmd, buf, 128)
    if r < 0:
        raise OSError(ctypes.get_errno(), f"bpf({cmd}): {os.strerror(ctypes.get_errno())}")
    return r


def possible_cpus():
    with open("/sys/devices/system/cpu/possible") as f:
        return sum(
            int(b) - int(a) + 1 if "-" in part else 1
            for part in f.read().strip().split(",")
            for a, _, b in [part.partition("-")]
        )


def metric_maps(ids):
    """{map name: id} of the maps our programs use (bpftool truncates names to 15 characters)."""
    progs = json.loads(
        subprocess.run(
            ["bpftool", "-j", "prog", "show"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    map_ids = {m for p in progs if p["id"] in ids for m in p.get("map_ids", [])}
    maps = json.loads(
        subprocess.run(
            ["bpftool", "-j", "map", "show"], check=True, capture_output=True, text=True, timeout=60
        ).stdout
    )
    return {m["name"]: m["id"] for m in maps if m["id"] in map_ids}


def fake_keys(first, last):
    """What a device doing 4-64 KiB reads and writes leaves in block_io's histograms: 5 size keys
    (4 buckets and the sum) per operation in each size map, 6 latency keys per operation and stage
    (5 buckets and the sum). 44 keys per device."""
    sizes, latency = [], []
    for d in range(first, last):
        dev = (d & 0xFF) | (FAKE_MAJOR << 8) | ((d & ~0xFF) << 12)
        for op in (0, 1):
            sizes += [struct.pack("<IB3xQ", dev, op, b) for b in (12, 13, 14, 15, 28)]
            latency += [
                struct.pack("<IBB2xQ", dev, op, stage, b)
                for stage in (0, 1)
                for b in (14, 15, 16, 17, 18, 37)
            ]
    return {"block_bio_size_": sizes, "block_rq_size_b": sizes, "block_rq_latenc": latency}


def prefill(maps, first, last):
    """Keys of devices first..last-1 into the exporter's maps, as if each had seen I/O."""
    value = ctypes.create_string_buffer(struct.pack("<Q", 1) * possible_cpus())
    for name, keys in fake_keys(first, last).items():
        fd = bpf(BPF_MAP_GET_FD_BY_ID, struct.pack("<III", maps[name], 0, 0))
        try:
            for key in keys:
                k = ctypes.create_string_buffer(key, len(key))
                bpf(
                    BPF_MAP_UPDATE_ELEM,
                    struct.pack("<IIQQQ", fd, 0, ctypes.addressof(k), ctypes.addressof(value), 0),
                )
        finally:
            os.close(fd)
    return sum(len(k) for k in fake_keys(first, last).values())


def scale_cost(names, sizes, rounds, runtime, size, ours_as=ROOT_IDENTITY):
    """ns per I/O of our programs (as bpf_cost measures it, run as `ours_as`) with the maps holding
    the keys of 0, 100, 1,000, 4,000, 10,000 devices: a hash lookup should cost the same however
    full the map (the keys written by this process, as root)."""
    results = {n: [] for n in sizes}
    with device("direct-io", size) as dev, bpf_stats_enabled():
        stack, hooks = hooks_per_io(dev, "direct-io")
        for r in range(rounds):
            with exporter(names, identity=ours_as) as url:
                ids = program_ids(url)
                maps, filled, entries = metric_maps(ids), 0, 0
                for n in sizes:
                    entries += prefill(maps, filled, n)
                    filled = n
                    before = prog_stats(ids)
                    report = fio.run(
                        [f"--filename={dev}", *WORKLOAD], runtime=runtime, name="bench-ebpf"
                    )
                    after = prog_stats(ids)
                    ns_run = {
                        ids[i].split(":")[1]: (after[i][1] - before[i][1])
                        / (after[i][0] - before[i][0])
                        for i in after
                        if i in before and after[i][0] > before[i][0]
                    }
                    ios = sum(job["read"]["total_ios"] for job in report["jobs"])
                    per_io = (
                        sum(ns * hooks.get(p, 0) for p, ns in ns_run.items())
                        + sum(
                            after[i][1] - before[i][1]
                            for i in after
                            if i in before and ids[i].split(":")[1] in TIMER_PROGRAMS
                        )
                        / ios
                    )
                    results[n].append((per_io, entries, fio.iops(report), ns_run))
                    print(
                        f"  scale round {r + 1}/{rounds}: {n:6d} devices ({entries} extra keys): "
                        f"{per_io:5.0f} ns/IO, {fio.iops(report):7.0f} IOPS",
                        flush=True,
                    )
    print(
        f"BPF ns per I/O against devices in the maps (median of {rounds} runs of {runtime} s each, "
        f"load {os.getloadavg()[0]:.1f}; 44 keys per device):"
    )
    print(
        "| devices in the maps | extra map entries | ns per I/O | bio_queue ns/run | rq_issue ns/run | "
        "rq_complete ns/run |"
    )
    print("|---|---|---|---|---|---|")
    for n, runs_ in results.items():
        med = lambda p: statistics.median(r[3].get(p, 0) for r in runs_)  # noqa: E731
        print(
            f"| {n:,} | {runs_[0][1]:,} | {statistics.median(r[0] for r in runs_):.0f} | "
            f"{med('block_bio_queue'):.0f} | {med('block_rq_issue'):.0f} | {med('block_rq_complete'):.0f} |",
            flush=True,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=8,
        help="rounds of IOPS runs per device, one run per side each (default 8)",
    )
    parser.add_argument(
        "--cost-rounds",
        type=int,
        default=5,
        help="rounds of the BPF run time comparison (default 5)",
    )
    parser.add_argument(
        "--runtime",
        type=int,
        default=2,
        help="seconds per fio run, after the IOPS runs' 1 s ramp (default 2)",
    )
    parser.add_argument("--size-mib", type=int, default=256, help="loop device size (default 256)")
    parser.add_argument(
        "--mode",
        choices=["page-cache", "direct-io", "both"],
        default="both",
        help="loop devices of the IOPS comparison",
    )
    parser.add_argument("--cost-only", action="store_true", help="only the BPF run time comparison")
    parser.add_argument(
        "--disk",
        help="only the BPF run time comparison, on this existing whole disk (e.g. "
        "nvme0n1 in a VM lab guest: make bench-kernels); the upstream objects must be built",
    )
    parser.add_argument(
        "--baseline",
        help="a directory of another build of our configs (NAME.bpf.o + NAME.yaml, "
        "e.g. main's .build/ebpf-configs) to measure beside this one",
    )
    parser.add_argument(
        "--scale",
        default="0,100,1000,4000,10000",
        help="devices whose keys fill the maps for the scale curve, comma-separated ('' for none)",
    )
    parser.add_argument(
        "--scale-rounds", type=int, default=2, help="runs of the scale curve (default 2)"
    )
    parser.add_argument(
        "--share-rounds",
        type=int,
        help="rounds of the BPF CPU share per loop (or on --disk), 0 for none (default 3, with "
        "--disk 0; needs perf)",
    )
    parser.add_argument(
        "--as-root",
        action="store_true",
        help="probe and run ours as root (default: as the Debian package and the Helm chart run "
        "ebpf_exporter, its own user with CAP_BPF and CAP_PERFMON)",
    )
    parser.add_argument(
        "--summary",
        metavar="FILE",
        help="write the figures to FILE as JSON: kernel, perf_event_paranoid, identity, configs, "
        "ns per I/O per side, CPU shares",
    )
    args = parser.parse_args()
    size = args.size_mib << 20
    if args.share_rounds is None:
        args.share_rounds = 0 if args.disk else 3

    if (
        not args.disk
    ):  # a guest's root is read-only: lab/bench/bench_kernels.py builds them on the host
        subprocess.run(
            ["make", "-s", "-C", os.path.join(ROOT, "ebpf-configs"), f"BUILD={BUILD}", "upstream"],
            check=True,
            timeout=300,
        )
    ours_as = ROOT_IDENTITY if args.as_root else production_identity()
    paranoid = read_sysctl(PARANOID)
    names, warnings = select_configs(ours_as)
    summary = {
        "release": os.uname().release,
        "perf_event_paranoid": paranoid,
        "unprivileged_bpf_disabled": read_sysctl("/proc/sys/kernel/unprivileged_bpf_disabled"),
        "identity": ours_as.name,
        "configs": names,
        "select_warnings": warnings,
    }
    print(
        f"kernel {summary['release']}: kernel.perf_event_paranoid {paranoid}, "
        f"kernel.unprivileged_bpf_disabled {summary['unprivileged_bpf_disabled']}",
        flush=True,
    )
    print(
        f"identity: ours (select-configs.sh's probes and ebpf_exporter) as {ours_as.name}; "
        "upstream biolatency and the floor as root",
        flush=True,
    )
    for line in warnings:
        print(f"  {line}", flush=True)
    print(
        f"our configs (chosen as {ours_as.name.split()[0]}): {names or 'none'}; "
        f"upstream: {UPSTREAM_DIR}/biolatency",
        flush=True,
    )
    if not names:
        sys.exit(f"none of our configs loads here as {ours_as.name}")
    foreign = foreign_programs()
    if foreign:
        print(
            f"WARNING: programs already on the block tracepoints ({', '.join(foreign)}): they run in every "
            "side, so the IOPS ratio understates the overhead; stop other ebpf_exporters for a clean figure",
            flush=True,
        )
    started = time.monotonic()
    if args.disk:
        summary["ns_per_io"] = bpf_cost(
            names, args.cost_rounds, args.runtime, size, args.disk, disk=args.disk, ours_as=ours_as
        )
        if args.share_rounds:
            # a VM lab guest's emulated CPU: fewer samples, each costs ~10x there
            summary["cpu_share"] = shares(
                [args.disk],
                names,
                args,
                size,
                ours_as,
                disk=args.disk,
                data_dir="/tmp",
                frequency=499,
            )
    else:
        summary["ns_per_io"] = bpf_cost(
            names,
            args.cost_rounds,
            args.runtime,
            size,
            "direct-io",
            args.baseline,
            ours_as=ours_as,
        )
        if args.scale:
            scale_cost(
                names,
                [int(x) for x in args.scale.split(",")],
                args.scale_rounds,
                args.runtime,
                size,
                ours_as,
            )
        if not args.cost_only:
            modes = ["page-cache", "direct-io"] if args.mode == "both" else [args.mode]
            summary["iops_ratio"] = {
                mode: compare(mode, names, args.rounds, args.runtime, size, ours_as)
                for mode in modes
            }
            if args.share_rounds:
                summary["cpu_share"] = shares(modes, names, args, size, ours_as)
    summary["seconds"] = round(time.monotonic() - started)
    print(f"({summary['seconds']} s)")
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


def shares(modes, names, args, size, ours_as, **kw):
    """{mode: cpu_share's {"share": {side: BPF share of the I/O path's CPU}, "io_path_samples":
    {side: samples}}}, or {"skipped": why} without a working perf."""
    if not shutil.which("perf"):
        print("perf not found (Debian's linux-perf): the BPF CPU share is skipped", flush=True)
        return {"skipped": "perf not found"}
    try:
        return {
            mode: cpu_share(mode, names, args.share_rounds, args.runtime + 1, size, ours_as, **kw)
            for mode in modes
        }
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        why = f"{' '.join(e.cmd[:2])} " + (
            f"timed out after {e.timeout:.0f} s"
            if isinstance(e, subprocess.TimeoutExpired)
            else f"failed: {err.strip()[-300:]}"
        )
        print(f"the BPF CPU share is skipped: {why}", flush=True)
        return {"skipped": why}


if __name__ == "__main__":
    sys.exit(main())
