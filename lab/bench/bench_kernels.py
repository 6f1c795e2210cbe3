"""BPF run time per I/O on each kernel of the VM lab's matrix, ours beside upstream ebpf_exporter's
examples/biolatency where it loads: a benchmark, not a test.

    make bench-kernels        (or: .venv/bin/python lab/bench/bench_kernels.py [KERNEL ...])

Each kernel boots once (vm.Guest, one emulated NVMe, kernel.perf_event_paranoid as the
distribution ships it: 3 on Debian's); in the guest ebpf-configs/bench/bench_overhead.py --disk
nvme0n1 has select-configs.sh pick our variants and runs our ebpf_exporter as users run it (its
own user with CAP_BPF and CAP_PERFMON: blockstack_deploy.privileges; --as-root for root), upstream's
biolatency and the empty programs (the floor) as root, and times every program with
kernel.bpf_stats_enabled during fio 4 KiB random direct reads, the sides (none, upstream's
biolatency, ours, the floor) interleaved in rounds; with --share-rounds N, then perf's BPF share
of the I/O path's CPU (the guest's CPUs mostly idle under TCG: a run on 6.1 resolved nothing,
1-19 samples on the I/O path). Under TCG every instruction is
emulated, so the nanoseconds are the emulator's, ~10x a real CPU's: the ratio ours / upstream in
the same guest is the figure (BENCHMARKS.md, "Kernel matrix").
"""

import argparse
import json
import os
import subprocess
import sys

from blockstack_deploy.stack import REPO
from blockstack_lab import vm, vm_scenarios

BENCH = os.path.join(REPO, "ebpf-configs", "bench", "bench_overhead.py")
# bench_overhead.py's side names: its bpf_cost's (the floor is "floor" in its cpu_share)
OURS, UPSTREAM, FLOOR = "ours", "upstream biolatency", "floor (empty programs)"
MIN_SAMPLES = (
    200  # bench_overhead.MIN_SHARE_SAMPLES: fewer samples on the I/O path resolve no share
)


def measure(kernel, rounds, runtime, share_rounds, as_root):
    """(release, bench_overhead.py's summary, its output) of one kernel."""
    with vm.Guest(kernel, nvme=1, say=vm.say) as g:
        summary = os.path.join(g.dir, "bench-summary.json")  # shared with the host read-write
        # jbd2 is a module: its variants attach only once it is loaded; each probe of
        # select-configs.sh takes minutes under TCG (vm.Guest.probe_ebpf_configs)
        r = g.run(
            f"modprobe ext4; SELECT_CONFIGS_TIMEOUT=300 {sys.executable} {BENCH} --disk nvme0n1 "
            f"--cost-rounds {rounds} --runtime {runtime} --share-rounds {share_rounds} "
            f"--summary {summary}" + (" --as-root" if as_root else ""),
            timeout=3600,
            check=False,
        )
        out = r.stdout + r.stderr
        if r.rc != 0:
            print(out, flush=True)
            raise vm.GuestError(f"bench_overhead.py in the guest: exit {r.rc}\n{out[-3000:]}")
        with open(summary) as f:
            return g.release, json.load(f), out


def share(s):
    """The CPU share cell: ours, upstream's and the floor's BPF share of the I/O path's CPU."""
    shares = s.get("cpu_share")
    if not shares:
        return "not measured (--share-rounds 0: under TCG perf saw 1-19 samples on the I/O path per run)"
    if "skipped" in shares:
        return f"not measured: {shares['skipped']}"
    (measured,) = shares.values()  # one device: the guest's nvme0n1
    by_side, samples = measured["share"], measured["io_path_samples"]
    cell = ", ".join(
        f"{name} {by_side[side]:.1%}"
        for name, side in (("ours", OURS), ("upstream", UPSTREAM), ("floor", "floor"))
        if side in by_side
    )
    if min(samples.values()) < MIN_SAMPLES:
        return (
            f"not resolvable: {min(samples.values()):.0f}-{max(samples.values()):.0f} perf samples "
            f"on the I/O path per run (the guest's CPUs idle while QEMU emulates the NVMe): {cell}"
        )
    return cell


def row(kernel, release, s):
    ns = s["ns_per_io"]
    upstream = ns.get(UPSTREAM)
    return (
        f"| {kernel} ({release}) | {s['perf_event_paranoid']} | {s['identity']} | "
        f"{', '.join(f'`{c}`' for c in s['configs'].split(','))} | {ns[OURS]:.0f} | "
        + (f"{upstream:.0f} | {ns[OURS] / upstream:.2f}x" if upstream else "does not load | -")
        + f" | {ns[FLOOR]:.0f} | {share(s)} |"
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernels", nargs="*", default=list(vm_scenarios.EXPECTED_CONFIGS))
    ap.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds per kernel (default 3)"
    )
    ap.add_argument("--runtime", type=int, default=10, help="seconds per fio run (default 10)")
    ap.add_argument(
        "--share-rounds",
        type=int,
        default=0,
        help="rounds of the BPF CPU share (perf) per kernel (default 0: under TCG the guest's CPUs "
        "idle while QEMU emulates the NVMe, and perf saw 1-19 samples on the I/O path per run)",
    )
    ap.add_argument(
        "--as-root",
        action="store_true",
        help="ours as root (default: ebpf_exporter's own user, as the Debian package runs it)",
    )
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
        release, summary, out = measure(
            k, args.rounds, args.runtime, args.share_rounds, args.as_root
        )
        print(out, flush=True)
        rows.append(row(k, release, summary))
    print(
        f"\nBPF ns per 4 KiB read under TCG (median of {args.rounds} interleaved rounds of "
        f"{args.runtime} s); CPU share: BPF's share of the I/O path's CPU (perf, "
        f"{args.share_rounds} round(s))\n"
        "| kernel | perf_event_paranoid | ours run as | variants chosen | ours ns/read | "
        "upstream ns/read | ours / upstream | floor ns/read | CPU share |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
