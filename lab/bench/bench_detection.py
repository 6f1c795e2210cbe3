#!/usr/bin/env python3
"""Detection quality: the healthy and the sick corpus (lab/blockstack_lab/corpus.py) against the
real stack (`make up`), one table, precision and recall.

    make bench-detection     (or: .venv/bin/python lab/bench/bench_detection.py [--state DIR] [NAME ...])

Starts the stack with `make up` in a fresh state directory on free ports (or uses --state), runs
the cases (default: `healthy sick`; any name of `python -m blockstack_lab list`, e.g. the
journal-starvation scenario) in order on one lab, and prints per case: what was expected (no
page / one page per named device), what the receiver got and what Prometheus had pending or
firing on the case's devices, the seconds from onset (the sysfs write) to the page at the
receiver, and from the fix to the resolve; then precision and recall of the pages. Goal: every
row correct, every page <= 40 s. A benchmark, not a test: it prints and exits 0 either way
unless something broke. About 25 minutes.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

from blockstack_lab import cli, corpus, report
from blockstack_lab.lab import install_signal_handlers


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "scenario",
        nargs="*",
        default=[],
        help="cases or scenarios (default: healthy sick; see python -m blockstack_lab list)",
    )
    p.add_argument(
        "--state", help="reuse this state directory (default: a fresh one, removed after)"
    )
    p.add_argument("--json", metavar="FILE", help="also write the checks as JSON")
    args = p.parse_args()
    names = args.scenario or ["healthy", "sick"]
    state = args.state or tempfile.mkdtemp(prefix="blockstack-bench-detection-")
    install_signal_handlers()
    load = os.getloadavg()
    start = time.time()
    try:
        checks = cli.run(names, state)
    except KeyboardInterrupt:
        print("interrupted")
        return 130
    finally:
        if not args.state:
            cli.make("clean", state, timeout=180)
            shutil.rmtree(state, ignore_errors=True)
    print()
    print(
        f"detection benchmark, {time.strftime('%Y-%m-%d %H:%M', time.localtime(start))}, "
        f"{(time.time() - start) / 60:.1f} min, kernel {os.uname().release}, {os.cpu_count()} CPUs, "
        f"load at start {load[0]:.1f}, at end {os.getloadavg()[0]:.1f}"
    )
    print(report.table(checks))
    pages = [s for c in checks for s in getattr(c, "page_seconds", {}).values()] or [
        c.seconds for c in checks if c.seconds is not None and c.expected.startswith("page")
    ]
    wrong = [c for c in checks if not c.correct]
    print(
        f"\n{len(checks) - len(wrong)}/{len(checks)} correct; pages after "
        + ", ".join(f"{s:.0f} s" for s in pages)
        + f" (goal <= 40 s: {'met' if pages and max(pages) <= 40 else 'NOT met'})"
    )
    if any(c.scenario in corpus.CASES for c in checks):
        print(corpus.format_summary(corpus.summary(checks)))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump([c.__dict__ for c in checks], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
