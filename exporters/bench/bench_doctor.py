#!/usr/bin/env python3
"""blockstack-doctor's time on bench_scrape.py's synthetic tree, and the findings collector's cost.

    bench_doctor.py [--devices 1024] [--runs 5] [--scrapes 12]

Runs the real `blockstack-doctor` on the tree (a process start each time, as a user runs it) and
prints its median wall and CPU time (the goal: <= 1 s); then collects the exporter's registry
on the same tree and prints the findings collector's duration (blockstack_scrape_collector_
duration_seconds{collector="findings"}) on the first scrape and the median of the later ones,
beside the whole collection. A benchmark, not a test: wall times depend on the machine's load
(the load average is printed), CPU times much less.
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import bench_scrape  # beside this file: the script's own directory is on the import path

from blockstack_exporter import checks
from blockstack_exporter.main import build_registry, parse_args
from blockstack_exporter.scrape import deadline

DOCTOR = os.path.join(os.path.dirname(sys.executable), "blockstack-doctor")


def flags(root):
    return [
        f"--path.sysfs={root}/sys",
        f"--path.procfs={root}/proc",
        f"--path.dev={root}/dev",
        f"--collector.dm.dmsetup={root}/dmsetup",
    ]


def time_doctor(root):
    """(wall seconds, CPU seconds, exit status, last line) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run(
        [DOCTOR, *flags(root), "--path.lvmconf=/nonexistent"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.returncode, r.stdout.strip().splitlines()[-1]


def collector_durations(registry):
    out = {}
    with deadline(time.monotonic() + 60):  # no collector cut short on a loaded machine
        families = list(registry.collect())  # (a generator: collected here, inside the deadline)
    for family in families:
        if family.name == "blockstack_scrape_collector_duration_seconds":
            out = {s.labels["collector"]: s.value for s in family.samples}
    return out


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--devices", type=int, default=1024)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--scrapes", type=int, default=12)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="blockstack-bench-doctor-")
    try:
        n = bench_scrape.generate(root, args.devices)
        print(
            f"synthetic tree: {n} block devices; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        runs = [time_doctor(root) for _ in range(args.runs)]
        print(
            f"blockstack-doctor: median {statistics.median(r[0] for r in runs):.2f} s wall, "
            f"{statistics.median(r[1] for r in runs):.2f} s CPU over {args.runs} runs "
            f"(min {min(r[0] for r in runs):.2f} s wall; exit {runs[-1][2]}; {runs[-1][3]})"
        )
        registry = build_registry(parse_args(flags(root)))
        scrapes = [collector_durations(registry) for _ in range(args.scrapes)]
        later = scrapes[1:]
        total = statistics.median(sum(s.values()) for s in later)
        findings = statistics.median(s["findings"] for s in later)
        print(
            f"findings collector: first scrape {scrapes[0]['findings'] * 1e3:.1f} ms of "
            f"{sum(scrapes[0].values()) * 1e3:.0f} ms; later scrapes median {findings * 1e3:.1f} ms of "
            f"{total * 1e3:.0f} ms ({findings / total:.1%})"
        )
        # CPU time of the checks alone on the Host of a whole scrape (wall times above include
        # waiting for the CPU on a busy machine); the collectors hand the Host already built
        findings = next(iter(registry._collector_to_names)).collectors[-1]
        eval_cpu = []
        for _ in range(5):
            with deadline(time.monotonic() + 60):
                registry.collect()
            start = time.process_time()
            found = checks.evaluate(findings.host, findings.knobs, needs=("scrape",))
            eval_cpu.append(time.process_time() - start)
        print(
            f"findings CPU, evaluated again on a whole scrape's Host ({len(findings.host.devices)} "
            f"devices, {len(found)} findings): checks {statistics.median(eval_cpu) * 1e3:.1f} ms"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
