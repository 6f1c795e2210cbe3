#!/usr/bin/env python3
"""Soak: healthy mixed I/O for a long time against the real stack, expecting zero pages.

    make soak     (or: .venv/bin/python lab/bench/soak.py [--minutes 10] [--state DIR])

`make up` in a fresh state directory on free ports, the lab's devices (the stacked pair with
ext4 on top, the single device), and at once for --minutes:
  - batched sequential 4 KiB direct reads on the single device and on the stacked pair's upper
    (merged into 256-sector requests; the lower carries the same sizes),
  - random 4 KiB direct reads and writes on a file in the ext4 (8-sector requests),
  - sequential 4 KiB buffered writes with an fsync every 256 writes to another file in the ext4
    (writeback merges them),
  - sequential 128 KiB direct reads and 1 MiB direct writes on a third file,
each rate-limited so the two cores also serve the stack. Every minute it narrates the lineup and
the alert state; at the end it prints every notification the receiver got (pages and tickets).
Healthy I/O must produce zero pages. Exit status 0 if none, 1 otherwise.
"""

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time

from blockstack_lab import cli, fio, scenarios
from blockstack_lab.lab import Lab, install_signal_handlers

SEQ_READ = [*fio.SEQ_BATCHED_READ, "--readonly", "--rate=150m"]


def workloads(lab):
    mnt, tag = lab.mounts["upper"], "soak"
    return [
        ([*SEQ_READ, f"--filename={lab.devices['single']}"], f"{tag}-seqread-single"),
        ([*SEQ_READ, f"--filename={lab.devices['upper']}"], f"{tag}-seqread-upper"),
        (
            [
                "--rw=randrw",
                "--bs=4k",
                "--direct=1",
                "--ioengine=libaio",
                "--iodepth=8",
                "--rate_iops=1500,500",
                "--size=48m",
                f"--filename={mnt}/random.dat",
            ],
            f"{tag}-random",
        ),
        (
            [
                "--rw=write",
                "--bs=4k",
                "--ioengine=psync",
                "--fsync=256",
                "--rate=20m",
                "--size=32m",
                f"--filename={mnt}/log.dat",
            ],
            f"{tag}-seqwrite",
        ),
        (
            [
                "--rw=rw",
                "--bsrange=128k-1m",
                "--direct=1",
                "--ioengine=libaio",
                "--iodepth=4",
                "--rate=40m,20m",
                "--size=48m",
                f"--filename={mnt}/bulk.dat",
            ],
            f"{tag}-bulk",
        ),
    ]


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument(
        "--state", help="reuse this state directory (default: a fresh one, removed after)"
    )
    args = p.parse_args()
    problems = cli.missing_requirements()
    if problems:
        sys.exit("cannot run: " + "; ".join(problems))
    install_signal_handlers()
    state = args.state or tempfile.mkdtemp(prefix="blockstack-soak-")
    load0 = os.getloadavg()[0]
    try:
        with cli.lab_stack(state) as view, Lab(say=cli.say) as lab:
            runner = scenarios.Runner(lab, view, scenarios.Timing(narrate_every=60), say=cli.say)
            with contextlib.ExitStack() as es:
                for argv, name in workloads(lab):
                    es.enter_context(runner.fio(argv, name))
                onset = time.time()
                cli.say(f"soak: {len(workloads(lab))} fio workloads for {args.minutes:g} min")
                runner.watch(args.minutes * 60, ["single", "upper", "lower"], onset)
                end = time.time()
            devices = list(lab.names().values())
            active = view.alerts(devices)
            got = view.notifications(onset)
    except KeyboardInterrupt:
        print("interrupted")
        return 130
    finally:
        if not args.state:
            with contextlib.suppress(Exception):
                cli.make("clean", state, timeout=180)
            shutil.rmtree(state, ignore_errors=True)
    # The stack watches every block device of the host: other users' loop devices may page too
    # (another test's nomerges=2); they are listed apart and do not count.
    pages = [n for n in got if n.path == "/page" and n.status == "firing" and n.device in devices]
    tickets = [
        n for n in got if n.path == "/ticket" and n.status == "firing" and n.device in devices
    ]
    others = [n for n in got if n.status == "firing" and n.device not in devices]
    print(
        f"\nsoak {time.strftime('%Y-%m-%d %H:%M', time.localtime(onset))}: {(end - onset) / 60:.1f} min of healthy "
        f"mixed I/O on {', '.join(devices)}; kernel {os.uname().release}, {os.cpu_count()} CPUs, load "
        f"{load0:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )
    print(
        f"pages: {len(pages)}"
        + "".join(f"\n  {n.alertname} on {n.device}: {n.annotations.get('summary')}" for n in pages)
    )
    print(
        f"tickets: {len(tickets)}"
        + "".join(
            f"\n  {n.alertname} on {n.device}: {n.annotations.get('summary')}" for n in tickets
        )
    )
    print(f"pending or firing at the end on the lab's devices: {active or 'none'}")
    print(
        f"notifications about devices outside the lab (other users' tests on this host; not counted): {len(others)}"
        + "".join(f"\n  {n.path} {n.alertname} on {n.device or '-'}" for n in others)
    )
    return 1 if pages else 0


if __name__ == "__main__":
    sys.exit(main())
