#!/usr/bin/env python3
"""What the stack costs, measured side by side in one run.

    make bench-cost     (or: .venv/bin/python lab/bench/bench_cost.py [--rounds N] [--scenario NAME])

1. eBPF overhead: fio 4 KiB random-read IOPS with every BPF config attached vs none
   (ebpf-configs/bench/bench_overhead.py, interleaved pairs; run first, before the stack starts,
   so no other ebpf_exporter's programs run in the 'without' runs).
2. Scrape time of blockstack-exporter vs node_exporter's diskstats on the synthetic 1024-device
   tree (exporters/bench/bench_scrape.py).
3. CPU and RSS of each component of the stack (`make up` in a fresh state directory) while a lab
   scenario runs (default merge-collapse-nomerges: sequential reads at ~10k-170k requests/s,
   a page): CPU seconds per second of wall time from /proc/PID/stat (children included, so
   dmsetup/supervisor helpers count), RSS sampled every second (max and at the end).
4. Series per device: what each scrape job (and the recording rules) holds for one busy lab
   device, from Prometheus at the end of the scenario.
A benchmark, not a test: it prints figures and asserts nothing. Needs root, fio, `make up`.
"""

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from blockstack_deploy.stack import COMPONENTS, REPO
from blockstack_deploy.supervisor import Supervisor
from blockstack_lab import cli, corpus, scenarios
from blockstack_lab.lab import Lab, install_signal_handlers

PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")


def sub_bench(title, argv, keep=None, timeout=1800):
    """Run an existing benchmark, stream its output, return the lines matching `keep`."""
    print(
        f"\n== {title}: {' '.join(os.path.relpath(a, REPO) if a.startswith(REPO) else a for a in argv)}",
        flush=True,
    )
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    print(proc.stdout, end="", flush=True)
    if proc.returncode != 0:
        print(proc.stderr, end="")
        return [f"{title}: FAILED (exit {proc.returncode})"]
    return [line.strip() for line in proc.stdout.splitlines() if keep and re.search(keep, line)]


def pids(state):
    running = {name: Supervisor(state).program_pid(name) for name in COMPONENTS}
    return {name: pid for name, pid in running.items() if pid}


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime, stime, cutime, cstime (fields 14-17 of proc(5); index 11-14 after the command)
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Sampler(threading.Thread):
    """CPU at start and end, RSS every second, of each component."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids, self.stop_event = pids, threading.Event()
        self.cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
        self.t0 = time.monotonic()
        self.rss_max = {n: 0 for n in pids}
        self.rss_last = {}

    def run(self):
        while not self.stop_event.wait(1):
            for n, p in self.pids.items():
                with contextlib.suppress(OSError):
                    r = rss_bytes(p)
                    self.rss_max[n] = max(self.rss_max[n], r)
                    self.rss_last[n] = r

    def finish(self):
        self.stop_event.set()
        self.join(5)
        dt = time.monotonic() - self.t0
        return {
            n: ((cpu_seconds(p) - self.cpu0[n]) / dt, self.rss_max[n], self.rss_last.get(n, 0))
            for n, p in self.pids.items()
        }, dt


def stack_costs(scenario):
    state = tempfile.mkdtemp(prefix="blockstack-bench-cost-")
    lines = []
    try:
        with cli.lab_stack(state) as view, Lab(say=cli.say) as lab:
            runner = scenarios.Runner(lab, view, say=cli.say)
            p = pids(state)
            sampler = Sampler(p)
            sampler.start()
            checks = corpus.run(runner, [scenario])
            costs, dt = sampler.finish()
            dev = lab.name("single" if scenario != "stack-split" else "lower")
            series = {
                r["metric"].get("job", ""): int(float(r["value"][1]))
                for r in view.prometheus.query(f'count by (job) ({{device="{dev}"}})')
            }
            devices = int(
                float(
                    view.prometheus.query(
                        'count(count by (device) (node_disk_reads_completed_total{job="node"}))'
                    )[0]["value"][1]
                )
            )
            total = {
                r["metric"].get("job", "(recording rules)"): int(float(r["value"][1]))
                for r in view.prometheus.query(
                    'count by (job) ({job=~"node|blockstack|ebpf", device!=""})'
                )
            }
        load = os.getloadavg()[0]
        lines.append(
            f"components during {scenario} ({dt:.0f} s, {checks[0].observed}; load {load:.1f} on {os.cpu_count()} CPUs):"
        )
        lines.append("| component | CPU (cores) | RSS max | RSS at end |")
        lines.append("|---|---|---|---|")
        for n in COMPONENTS:
            if n in costs:
                cpu, mx, last = costs[n]
                lines.append(f"| {n} | {cpu:.3f} | {mx / 2**20:.0f} MiB | {last / 2**20:.0f} MiB |")
        lines.append(f"series for one busy device ({dev}) in Prometheus, by job:")
        for job, n in sorted(series.items(), key=lambda kv: kv[0] or ""):
            lines.append(f"  {job or '(recording rules, alerts)'}: {n}")
        lines.append(f"  total: {sum(series.values())}")
        lines.append(
            "all device-labelled series of the exporters on this host: "
            + ", ".join(f"{j} {n}" for j, n in sorted(total.items()))
            + f" over {devices} devices in diskstats (incl. idle ones): "
            + f"{sum(total.values()) / max(devices, 1):.1f} per device"
        )
    finally:
        with contextlib.suppress(Exception):
            cli.make("clean", state, timeout=180)
        shutil.rmtree(state, ignore_errors=True)
    return lines


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="pairs of fio runs per device in the eBPF overhead part",
    )
    p.add_argument("--scrape-rounds", type=int, default=40)
    p.add_argument(
        "--scenario", default="merge-collapse-nomerges", choices=list(scenarios.SCENARIOS)
    )
    args = p.parse_args()
    problems = cli.missing_requirements()
    if problems:
        sys.exit("cannot run: " + "; ".join(problems))
    install_signal_handlers()
    start = time.time()
    load0 = os.getloadavg()[0]
    summary = []
    try:
        summary += sub_bench(
            "eBPF overhead",
            [
                PY,
                os.path.join(REPO, "ebpf-configs/bench/bench_overhead.py"),
                "--rounds",
                str(args.rounds),
            ],
            keep=r"^(page-cache|direct-io|identity:|our configs|kernel )|BPF run time|WARNING",
        )
        summary += sub_bench(
            "scrape time",
            [
                PY,
                os.path.join(REPO, "exporters/bench/bench_scrape.py"),
                "--rounds",
                str(args.scrape_rounds),
            ],
            keep=r"synthetic tree|median|ratio",
        )
        print(f"\n== CPU, RSS and series while {args.scenario} runs against `make up`", flush=True)
        summary += stack_costs(args.scenario)
    except KeyboardInterrupt:
        print("interrupted")
        return 130
    print(
        f"\n== summary ({time.strftime('%Y-%m-%d %H:%M', time.localtime(start))}, {(time.time() - start) / 60:.1f} min, "
        f"kernel {os.uname().release}, {os.cpu_count()} CPUs, load {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end)"
    )
    for line in summary:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
