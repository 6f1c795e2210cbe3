"""BPF run time per I/O on each kernel of the VM lab's matrix, ours beside upstream ebpf_exporter's
examples/biolatency where it loads: a benchmark, not a test.

    make bench-kernels        (or: .venv/bin/python lab/bench/bench_kernels.py [KERNEL ...])

Each kernel boots once (vm.Guest, one emulated NVMe); in the guest select-configs.sh picks our
variants and ebpf-configs/bench/bench_overhead.py --disk nvme0n1 times every program with
kernel.bpf_stats_enabled during fio 4 KiB random direct reads, the sides (none, upstream's
biolatency, ours, empty programs) interleaved in rounds. Under TCG every instruction is emulated,
so the nanoseconds are the emulator's, ~10x a real CPU's: the ratio ours / upstream in the same
guest is the figure (BENCHMARKS.md, "Kernel matrix").
"""

import argparse
import os
import re
import subprocess
import sys

from blockstack_deploy.stack import REPO
from blockstack_lab import vm, vm_scenarios

BENCH = os.path.join(REPO, "ebpf-configs", "bench", "bench_overhead.py")


def measure(kernel, rounds, runtime):
    """(configs, the guest's summary lines) of one kernel."""
    with vm.Guest(kernel, nvme=1, say=vm.say) as g:
        configs = g.ebpf_configs()
        r = g.run(
            f"modprobe ext4; {sys.executable} {BENCH} --disk nvme0n1 --cost-rounds {rounds} "
            f"--runtime {runtime}",
            timeout=3600,
            check=False,
        )
        out = r.stdout + r.stderr
        if r.rc != 0:
            raise vm.GuestError(f"bench_overhead.py in the guest: exit {r.rc}\n{out[-3000:]}")
        return g.release, configs, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernels", nargs="*", default=list(vm_scenarios.EXPECTED_CONFIGS))
    ap.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds per kernel (default 3)"
    )
    ap.add_argument("--runtime", type=int, default=10, help="seconds per fio run (default 10)")
    args = ap.parse_args(argv)
    if not vm.ready(args.kernels):
        return 2
    # upstream's biolatency and the floor, built on the host (the guest's root is read-only)
    subprocess.run(
        ["make", "-s", "-C", os.path.join(REPO, "ebpf-configs"), "upstream"],
        check=True,
        timeout=300,
    )
    rows = []
    for k in args.kernels:
        release, configs, out = measure(k, args.rounds, args.runtime)
        print(out, flush=True)
        summary = re.search(r"^BPF run time per I/O .*$", out, re.M)
        rows.append(
            f"| {k} ({release}) | {configs} | {summary.group(0) if summary else 'no figure'} |"
        )
    print("\n| kernel | configs | BPF run time per I/O (TCG) |\n| --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
