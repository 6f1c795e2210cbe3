#!/usr/bin/env python3
"""Overhead of the BPF programs: fio 4 KiB random-read IOPS on a loop device with every config
this kernel loads attached (ebpf_exporter running) vs none, in interleaved runs.

    make bench-ebpf        (or: .venv/bin/python ebpf-configs/bench/bench_overhead.py [--rounds N])

A benchmark, not a test: it prints figures and asserts nothing. Needs root, fio, `make ebpf-build`.
Goal: IOPS ratio with/without >= 0.98.

Two loop devices, because the overhead is a fixed CPU cost per I/O and its share depends on
what an I/O costs otherwise:
  page-cache  loop over a file in the page cache: an I/O is a few microseconds of CPU and
              nothing else, the worst case (few real devices complete 4 KiB reads this cheaply);
  direct-io   loop with --direct-io=on over a file on the root filesystem's disk: each I/O
              reaches a real device, like the disks this stack watches.
Runs alternate with/without (order flipped each round) so drift and neighbours' load spread over
both sides; the figure is the median of the per-round ratios (ratio of medians beside it).
Last, one run with kernel.bpf_stats_enabled=1 reports the programs' own run time per I/O,
a figure that does not depend on the machine's noise.
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

from blockstack_lab import fio, loop, procs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, ".build"))
EXPORTER = os.path.join(BUILD, "bin", "ebpf_exporter")
CONFIG_DIR = os.path.join(BUILD, "ebpf-configs")
SELECT = os.path.join(ROOT, "ebpf-configs", "select-configs.sh")
BPF_STATS = "/proc/sys/kernel/bpf_stats_enabled"

# The programs every read of the workload runs once (block_rq_issue is in two configs; with
# scheduler `none` most requests skip block_rq_insert).
PER_READ_PROGRAMS = {"block_bio_queue", "block_rq_issue", "block_rq_complete"}

# 4 KiB random direct reads, one job, queue depth 16 (blockstack_lab.fio.RANDOM_4K_READ).
WORKLOAD = fio.RANDOM_4K_READ


def run_fio(dev, runtime):
    return fio.iops(fio.run([f"--filename={dev}", *WORKLOAD], runtime=runtime, name="bench-ebpf"))


@contextlib.contextmanager
def exporter(names):
    port = procs.free_port()
    argv = [EXPORTER, f"--config.dir={CONFIG_DIR}", f"--config.names={names}",
            f"--web.listen-address=127.0.0.1:{port}"]
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
        subprocess.run(["dd", "if=/dev/zero", f"of={dev}", "bs=1M", f"count={size >> 20}", "oflag=direct",
                        "status=none"], check=True, timeout=300)
        yield dev


def compare(mode, names, rounds, runtime, size):
    without, with_ = [], []
    with device(mode, size) as dev:
        run_fio(dev, 1)  # warm caches and CPU frequency
        for i in range(rounds):
            order = ("without", "with") if i % 2 == 0 else ("with", "without")
            for side in order:
                if side == "with":
                    with exporter(names):
                        iops = run_fio(dev, runtime)
                    with_.append(iops)
                else:
                    iops = run_fio(dev, runtime)
                    without.append(iops)
                print(f"  {mode} round {i + 1}/{rounds} {side:>7}: {iops:10.0f} IOPS", flush=True)
    # Each round's two runs are seconds apart, so their ratio is the least disturbed by drift.
    pair = statistics.median(w / wo for w, wo in zip(with_, without))
    ratio = statistics.median(with_) / statistics.median(without)
    print(f"{mode}: IOPS ratio with/without {pair:.3f} (median of {rounds} interleaved pairs; goal >= 0.98); "
          f"medians {statistics.median(with_):.0f} with, {statistics.median(without):.0f} without "
          f"(ratio of medians {ratio:.3f})", flush=True)
    return pair


def foreign_programs():
    """BPF programs already attached to the block tracepoints by someone else (another
    ebpf_exporter, bpftrace): they run in the 'without' runs too and shrink the difference."""
    progs = json.loads(subprocess.run(["bpftool", "-j", "prog", "show"], check=True, capture_output=True,
                                      text=True, timeout=60).stdout)
    return [f'{p["id"]}:{p.get("name")}' for p in progs
            if p.get("type") in ("tracing", "raw_tracepoint") and p.get("name") in PER_READ_PROGRAMS]


def program_ids(url):
    """Ids of the exporter's programs, from its ebpf_exporter_ebpf_program_info metric."""
    ids = {}
    for line in procs.http_get(url).splitlines():
        if line.startswith("ebpf_exporter_ebpf_program_info{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))
            ids[int(labels["id"].strip('"'))] = f'{labels["config"].strip(chr(34))}:{labels["program"].strip(chr(34))}'
    return ids


def bpf_cost(names, runtime, size):
    """BPF run time per I/O, from the kernel's own accounting (kernel.bpf_stats_enabled)."""
    with open(BPF_STATS) as f:
        old = f.read().strip()
    try:
        with loop.attached(size) as dev, exporter(names) as url:
            with open(BPF_STATS, "w") as f:
                f.write("1")
            iops = run_fio(dev, runtime)
            progs = {p["id"]: p for p in json.loads(subprocess.run(
                ["bpftool", "-j", "prog", "show"], check=True, capture_output=True, text=True, timeout=60).stdout)}
            per_io = 0.0
            for pid, name in sorted(program_ids(url).items()):
                p = progs.get(pid, {})
                cnt, ns = p.get("run_cnt", 0), p.get("run_time_ns", 0)
                if not cnt:
                    continue
                # Counts include every device's I/O on the machine, so the cost of one read is
                # the sum of time per run of the programs a read passes through, not total / I/Os.
                hot = name.split(":")[1] in PER_READ_PROGRAMS
                per_io += ns / cnt if hot else 0
                print(f"  {name:45s} {cnt:10d} runs {ns / cnt:7.1f} ns/run{'  (once per read)' if hot else ''}")
            print(f"BPF run time per 4 KiB read: {per_io:.0f} ns (fio at {iops:.0f} IOPS; includes "
                  f"bpf_stats' own timing, two clock reads per run)")
    finally:
        with open(BPF_STATS, "w") as f:
            f.write(old)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="pairs of runs per device (default 8)")
    parser.add_argument("--runtime", type=int, default=2, help="seconds per fio run (default 2)")
    parser.add_argument("--size-mib", type=int, default=256, help="loop device size (default 256)")
    parser.add_argument("--mode", choices=["page-cache", "direct-io", "both"], default="both")
    args = parser.parse_args()
    size = args.size_mib << 20

    names = subprocess.run([SELECT, EXPORTER, CONFIG_DIR], check=True, capture_output=True, text=True,
                           timeout=300).stdout.strip()
    print(f"configs attached in 'with' runs: {names}", flush=True)
    foreign = foreign_programs()
    if foreign:
        print(f"WARNING: programs already on the block tracepoints ({', '.join(foreign)}): they run in both "
              "sides, so the ratio understates the overhead; stop other ebpf_exporters for a clean figure", flush=True)
    modes = ["page-cache", "direct-io"] if args.mode == "both" else [args.mode]
    started = time.monotonic()
    for mode in modes:
        compare(mode, names, args.rounds, args.runtime, size)
    bpf_cost(names, args.runtime, size)
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
