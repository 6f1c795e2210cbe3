"""blockstack-doctor: reads a host once and names every block-stack misconfiguration, with the fix.

It reads what the exporter reads (the same collectors, the same --path.* flags), judges it with
the exporter's table of checks (checks.py, thresholds from alerts/config.yml) and prints, per
stack from the top device down, each finding: the device, what is wrong, the evidence read, why
it matters, the command that fixes it now and how to make the fix persist.

    blockstack-doctor                       # the whole host
    blockstack-doctor --device vg/snap      # the stacks holding one device
    blockstack-doctor --interval 5          # and each layer's requests over 5 s (iostat's lineup)
    blockstack-doctor --interval 5 --ebpf http://127.0.0.1:9435/metrics   # refused merges, splits,
                                            # and whose I/O (block cgroups) they hurt

Exit status: 0 no finding at warning or above, 1 findings at warning or above (or, with
--collector.ebpf.status-file, a set of BPF programs this kernel does not load), 2 something it
needs could not be read (a collector failed as a whole, no block devices, --device unknown,
ebpf_exporter unreachable, the status file); the findings it could make are printed all the same.
"""

import argparse
import logging
import sys
import time

from . import __version__, checks, knobs, persist
from .collapse import INTERVAL_KNOBS
from .fs import ParseError
from .lineup import ebpf_rates, lineup
from .report import ebpf_sets, render_json, render_text, stacks_of
from .sampling import Doctor
from .scrape import add_dm_flags, add_path_flags

log = logging.getLogger("blockstack_exporter")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="blockstack-doctor",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_path_flags(p)
    p.add_argument(
        "--path.lvmconf",
        dest="lvmconf",
        default="/etc/lvm/lvm.conf",
        help="lvm.conf, read for the autoextend thresholds (default %(default)s)",
    )
    p.add_argument(
        "--path.rootfs",
        dest="rootfs",
        default="/",
        help="the root holding /etc, /run and /usr: udev rules, udev's database and tuned profiles, read "
        "for the persist recipes and what would set a queue attribute again (default %(default)s)",
    )
    add_dm_flags(p, timeout=10.0)
    p.add_argument(
        "--config.knobs",
        dest="knobs",
        default=None,
        metavar="PATH",
        help="the alerts' config.yml whose thresholds to judge by (default: the copy shipped "
        "with the exporter)",
    )
    p.add_argument(
        "--device", help="only the stacks holding this device (dm-3, /dev/mapper/vg-lv, vg/lv, sda)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="read twice, SECONDS apart, and show each layer's requests (iostat's lineup), COW fill "
        "rates and live collapses",
    )
    p.add_argument(
        "--ebpf",
        metavar="URL",
        help="ebpf_exporter's /metrics: refused merges, splits and jbd2 credit waits in the "
        "lineup, with the block cgroups whose I/O they are (needs --interval)",
    )
    p.add_argument(
        "--collector.ebpf.status-file",
        dest="ebpf_status_file",
        metavar="PATH",
        help="ebpf-configs/select-configs.sh's status file (make up: STATE_DIR/ebpf-status.tsv): a set "
        "of BPF programs this kernel does not load is a warning (exit 1)",
    )
    p.add_argument("--version", action="version", version=__version__)
    args = p.parse_args(argv)
    if args.ebpf and not args.interval:
        p.error("--ebpf needs --interval (its counters are read twice)")
    if args.interval is not None and not 0 < args.interval <= 3600:
        p.error("--interval: between 0 and 3600 seconds")
    return args


def run(args, out=sys.stdout):
    try:
        knob_values = knobs.load(args.knobs, (*checks.KNOBS, *INTERVAL_KNOBS))
    except knobs.KnobsError as e:
        print(f"blockstack-doctor: --config.knobs: {e}", file=sys.stderr)
        return 2
    doctor = Doctor(args, knob_values)
    try:
        first, second = _samples(args, doctor)
    except (OSError, ParseError, ValueError) as e:  # URLError is an OSError
        print(f"blockstack-doctor: {e}", file=sys.stderr)
        return 2
    finally:
        log.removeHandler(doctor._handler)
    now = second or first
    host = now.host or checks.Host()
    host.lvm_conf = doctor.lvm_conf()
    report = {"lineup": None, "ebpf": bool(args.ebpf), "narrowed": bool(args.device)}
    if second:
        elapsed = second.when - first.when
        host.previous, host.elapsed = first.host, elapsed
        host.ebpf = ebpf_rates(first, second, elapsed)
        report["lineup"] = host.lineup = lineup(first, second, elapsed)
    problems = doctor.messages
    findings, unreadable = _judge(args, host, knob_values, problems)
    if now.failed:
        problems.append(f"collector(s) {', '.join(now.failed)} failed as a whole")
        unreadable = True
    if not host.devices:
        problems.append(f"no block devices under {args.sysfs}/class/block")
        unreadable = True
    unreadable |= _scope(args, host, findings, report, problems)
    report["problems"] = problems
    serious = any(f.severity in ("critical", "warning") for f in report["findings"])
    report["ebpf_sets"] = ebpf_sets(args.ebpf_status_file, problems)
    blind = any(not s["config"] for s in report["ebpf_sets"].values())
    unreadable |= args.ebpf_status_file is not None and report["ebpf_sets"] == {}
    report["exit"] = 2 if unreadable else 1 if serious or blind else 0
    out.write(render_json(report, host) if args.json else render_text(report, host))
    return report["exit"]


def _samples(args, doctor):
    """The first sample, and with --interval the second one, SECONDS later (else None)."""
    first = doctor.sample(with_rates=args.interval is not None)
    if not args.interval:
        return first, None
    time.sleep(args.interval)
    return first, doctor.sample(with_rates=True)


def _judge(args, host, knob_values, problems):
    """(every finding most severe first, with its persist recipes; whether a check failed)."""
    failed = []
    findings = checks.evaluate(
        host, knob_values, needs=("scrape", "lvm.conf", "interval"), failed=failed
    )
    try:
        persist.attach(persist.Context(args.sysfs, args.rootfs), host, findings)
    except Exception as e:  # noqa: BLE001 - a recipe's bug must not hide the findings
        problems.append(f"persist recipes failed: {e!r}")
    problems += [f"check {check} failed: {e!r}" for check, e in failed]
    return findings, bool(failed)


def _scope(args, host, findings, report, problems):
    """The stacks and findings of --device (all without it) into the report; True when the
    device is unknown."""
    only = None
    if args.device:
        only = host.resolve(args.device)
        if only is None:
            problems.append(f"--device {args.device}: no such block device")
    report["stacks"] = stacks_of(host, only) if only or not args.device else []
    in_scope = {d for _, devices in report["stacks"] for d in devices}
    report["findings"] = [f for f in findings if f.device in in_scope or not host.devices]
    return bool(args.device) and only is None


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.exit(run(args))


if __name__ == "__main__":
    main()
