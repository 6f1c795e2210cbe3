"""How long "Block Stack Merges" takes to load in Grafana + chromium, over the dashboard's default
time range (now-1h) with the lab's devices ($stack = the lab's upper loop device, $device = All),
during a lab collapse (blockstack_lab/dashboard_lab.py). A benchmark, not a test: it prints and
asserts nothing.

    sudo .venv/bin/python dashboards/bench/bench_dashboard.py [--rounds 3]     # make bench-dashboard

A 1600x1000 window, in a fresh browser each round after logging in, scrolled panel by panel as a
reader does (Grafana queries a panel only once it is in view), waiting for 0.5 s of quiet per panel
(no loading bar, no query in flight) before scrolling on: "every panel loaded" is when the last
panel went quiet, counted from the start of the navigation, so it includes the scrolling. The
slowest panel query is the longest /api/ds/query round trip the page made (the browser's request
timing, what Grafana's query inspector shows as "Total request time"), named by the panel title
Grafana sends with it (X-Panel-Title).
"""

import argparse
import os
import statistics
import tempfile

import blockstack_dashboard
from blockstack_lab import dashboard_lab
from blockstack_lab.grafana_browser import Browser

VIEWPORT = (1600, 1000)


def visit(lab):
    with Browser(lab.stack.url("grafana"), lab.grafana_password, viewport=VIEWPORT) as b:
        b.login()
        # the default time range (no from/to); auto-refresh pushed out of the measurement (1d)
        params = {
            "orgId": 1,
            "var-host": lab.stack.host,
            "var-stack": lab.upper,
            "var-device": "$__all",
            "refresh": "1d",
        }
        opened = b.open_dashboard(blockstack_dashboard.CONFIG["uid"], params)
        states = b.load_every_panel()
        seconds = max(s["loaded_at"] for s in states.values()) - opened
        timed = [
            (q["ms"], q["request"].headers.get("x-panel-title") or "annotation")
            for q in b.queries
            if q.get("ms")
        ]
        return seconds, max(timed), len(states), len(timed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    runs = []
    with (
        tempfile.TemporaryDirectory(prefix="blockstack-bench-dashboard-") as work,
        dashboard_lab.collapse(work) as lab,
    ):
        print(
            f">> lab devices: {lab.upper} over {lab.lower}; load average {os.getloadavg()[0]:.1f}"
        )
        for r in range(args.rounds):
            seconds, (ms, panel), panels, queries = visit(lab)
            runs.append((seconds, ms, panel))
            print(
                f"round {r + 1}: {panels} panels, {queries} queries: every panel loaded "
                f"{seconds:.1f} s after opening; slowest query {ms:.0f} ms ({panel})"
            )
    slowest = max(runs, key=lambda run: run[1])
    print(
        f"\nmedians of {args.rounds} rounds (load average {os.getloadavg()[0]:.1f} at the end): "
        f"every panel loaded {statistics.median(r[0] for r in runs):.1f} s; slowest query median "
        f"{statistics.median(r[1] for r in runs):.0f} ms, max {slowest[1]:.0f} ms ({slowest[2]})"
    )


if __name__ == "__main__":
    main()
