#!/usr/bin/env python3
"""Collapse onset -> page on each set of servers, side by side in one run.

    make bench-servers     (or: .venv/bin/python lab/bench/bench_servers.py [--rounds N])

One lab and one set of exporters (node_exporter, blockstack-exporter, ebpf_exporter), scraped
every 5 s by two stacks at once, one per set of servers (blockstack_deploy.stack.SERVERS: Debian's
Prometheus 2.42 + Alertmanager 0.25, and Prometheus 3.16 + Alertmanager 0.31), each with the
same rules, Alertmanager configuration and its own page receiver. Each round flips the two
collapses of alerts/tests/test_integration.py at once under sequential batched 4 KiB direct reads
(loop1 on a file on ext4 on loop0: loop0's max_sectors_kb 4 -> BlockStackMergeCollapse; loop2
alone: nomerges 2 -> BlockStackMergeCollapse (merging refused)), waits for both pages at both receivers, restores
and waits for the resolves. Prints seconds from the flip to each page per version. Both servers
see the same samples of the same collapse, so the difference is the servers' own (plus where each
one's 5 s scrape and evaluation ticks fall). A benchmark, not a test: it prints and exits 0 unless
something broke. About 1.5 minutes per round; needs root and `make upstream-servers`.
"""

import argparse
import contextlib
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from blockstack_deploy.stack import SERVERS, Stack, program
from blockstack_lab import fio, loop
from blockstack_lab.api import Prometheus
from blockstack_testsupport import procs
from page_receiver import received

PAGES = (("BlockStackMergeCollapse", "layered"), ("BlockStackMergeCollapse", "single"))
TIMEOUT = 120


def fired(stack, alertname, device, status, since):
    return [
        r["received_at"]
        for r, a in received(stack.pages_file, since)
        if a["status"] == status
        and a["labels"].get("alertname") == alertname
        and a["labels"].get("device") == device
    ]


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (loop devices, sysfs, BPF)")
    work = tempfile.mkdtemp(prefix="blockstack-bench-servers-")
    names = list(SERVERS)
    results = {n: {kind: [] for _, kind in PAGES} for n in names}
    start = time.time()
    load = os.getloadavg()[0]
    with contextlib.ExitStack() as es:
        es.callback(subprocess.run, ["rm", "-rf", work], timeout=60)  # last, also on failure
        dev0, dev1, _ = es.enter_context(
            loop.stacked_pair(768 << 20, 512 << 20, directory="/dev/shm")
        )
        dev2 = es.enter_context(loop.attached(256 << 20, directory="/dev/shm"))
        subprocess.run(["sync"], check=True, timeout=60)
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("1")
        devices = {"layered": loop.name(dev0), "single": loop.name(dev2)}

        # The first stack runs the exporters; the others scrape the same ones (same ports).
        first = Stack(os.path.join(work, names[0]), servers=names[0])
        stacks = {names[0]: es.enter_context(first.running())}
        shared = {c: first.ports[c] for c in ("node", "blockstack", "ebpf")}
        for n in names[1:]:
            s = Stack(
                os.path.join(work, n), servers=n, ports=shared, ebpf_configs=first._ebpf_configs
            )
            s.render()
            for name, (argv, env, health) in s.commands().items():
                if name not in shared:
                    es.enter_context(
                        procs.running(
                            argv,
                            env=env,
                            health_url=health,
                            timeout=90,
                            log_path=os.path.join(s.workdir, f"{name}.log"),
                        )
                    )
            stacks[n] = s
        for s in stacks.values():
            Prometheus(s.url("prometheus")).wait_targets_up()
        for dev in (dev1, dev2):
            es.enter_context(
                procs.running(
                    [
                        "fio",
                        f"--name=bench-{loop.name(dev)}",
                        f"--filename={dev}",
                        "--time_based",
                        f"--runtime={args.rounds * 240 + 120}",
                        *fio.SEQ_BATCHED_READ,
                    ],
                    log_path=os.path.join(work, f"fio-{loop.name(dev)}.log"),
                )
            )
        time.sleep(30)  # the recording rules' 20 s windows fill with healthy samples

        for i in range(args.rounds):
            with (
                loop.sysfs_setting(dev0, "queue/max_sectors_kb", 4),
                loop.sysfs_setting(dev2, "queue/nomerges", 2),
            ):
                flipped = time.time()
                for n, s in stacks.items():
                    for alertname, kind in PAGES:
                        procs.wait_until(
                            f"{n}: {alertname}",
                            lambda: fired(s, alertname, devices[kind], "firing", flipped),
                            TIMEOUT,
                        )
                        results[n][kind].append(
                            min(fired(s, alertname, devices[kind], "firing", flipped)) - flipped
                        )
                print(
                    f"round {i + 1}: "
                    + "; ".join(
                        f"{n} {kind} {results[n][kind][-1]:.1f} s"
                        for n in names
                        for _, kind in PAGES
                    ),
                    flush=True,
                )
            restored = time.time()
            for n, s in stacks.items():
                for alertname, kind in PAGES:
                    procs.wait_until(
                        f"{n}: {alertname} resolved",
                        lambda: fired(s, alertname, devices[kind], "resolved", restored),
                        TIMEOUT,
                    )
            time.sleep(10)

    versions = {
        n: subprocess.run(
            [program("prometheus", n), "--version"], capture_output=True, text=True
        ).stdout.split()[2]
        for n in names
    }
    print(
        f"\nservers benchmark, {time.strftime('%Y-%m-%d %H:%M', time.localtime(start))}, {args.rounds} rounds, "
        f"{(time.time() - start) / 60:.1f} min, load at start {load:.1f}, at end {os.getloadavg()[0]:.1f}"
    )
    print(
        "| servers | Prometheus | collapse (layered, BlockStackMergeCollapse) | nomerges=2 (BlockStackMergeCollapse, merging refused) |"
    )
    print("|---|---|---|---|")
    for n in names:
        cells = [
            ", ".join(f"{v:.1f}" for v in results[n][kind])
            + f" (median {statistics.median(results[n][kind]):.1f})"
            for _, kind in PAGES
        ]
        print(f"| {n} | {versions[n]} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
