"""How long "Block Stack Merges" takes to load in Grafana + chromium, over the dashboard's default
time range (now-1h) with the lab's devices ($stack = the lab's upper loop device, $device = All),
during a lab collapse (dashboards/lab_run.py). A benchmark, not a test: it prints and asserts nothing.

    sudo .venv/bin/python dashboards/bench_dashboard.py [--rounds 3]     # make bench-dashboard

Two ways of opening the dashboard, interleaved, each in a fresh browser after logging in:
  all-in-view  a viewport tall enough for the whole dashboard: every panel queries at once; the time
               from starting the navigation to the answer of the last of its 29 /api/ds/query
               requests, once no panel shows a loading bar, is "opening to every panel loaded".
  scrolled     a 1600x1000 viewport, scrolled panel by panel as a reader would (Grafana queries a
               panel only once it is in view), waiting 0.5 s of quiet per panel before scrolling on:
               an upper bound that includes the scrolling.
The slowest panel query is the longest /api/ds/query round trip the page made (the browser's
request timing, what Grafana's query inspector shows as "Total request time"), named by the panel
title Grafana sends with it (X-Panel-Title).
"""
import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import blockstack_dashboard  # noqa: E402
import lab_run  # noqa: E402
from grafana_browser import Browser  # noqa: E402

# /api/ds/query requests of one load with $device = All over the lab's three devices: one per panel
# (repeated heatmaps once per device) and the annotation's
REQUESTS = 29
VIEWPORTS = {"all-in-view": (1600, 6000), "scrolled": (1600, 1000)}


def visit(lab, viewport):
    with Browser(lab.stack.url("grafana"), lab.grafana_password, viewport=viewport) as b:
        b.login()
        # the default time range (no from/to); auto-refresh pushed out of the measurement (1d)
        params = {"orgId": 1, "var-host": lab.stack.host, "var-stack": lab.upper, "var-device": "$__all",
                  "refresh": "1d"}
        opened = b.open_dashboard(blockstack_dashboard.CONFIG["uid"], params)
        if viewport == VIEWPORTS["all-in-view"]:
            loaded = b.wait_all_loaded(REQUESTS)
        states = b.load_every_panel()
        if viewport != VIEWPORTS["all-in-view"]:
            loaded = max(s["loaded_at"] for s in states.values())
        seconds = loaded - opened
        timed = [(q["ms"], q["request"].headers.get("x-panel-title") or "annotation") for q in b.queries if q.get("ms")]
        return seconds, max(timed), len(states), len(timed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    results = {name: [] for name in VIEWPORTS}
    with tempfile.TemporaryDirectory(prefix="blockstack-bench-dashboard-") as work, lab_run.collapse(work) as lab:
        print(f">> lab devices: {lab.upper} over {lab.lower}; load average {os.getloadavg()[0]:.1f}")
        for r in range(args.rounds):
            for name, viewport in VIEWPORTS.items():
                seconds, (ms, panel), panels, queries = visit(lab, viewport)
                results[name].append((seconds, ms, panel))
                print(f"round {r + 1} {name:<12} {panels} panels, {queries} queries: every panel loaded "
                      f"{seconds:.1f} s after opening; slowest query {ms:.0f} ms ({panel})")
    print(f"\nmedians of {args.rounds} rounds (load average {os.getloadavg()[0]:.1f} at the end):")
    for name, runs in results.items():
        slowest = max(runs, key=lambda run: run[1])
        print(f"  {name:<12} every panel loaded {statistics.median(r[0] for r in runs):.1f} s; slowest query "
              f"median {statistics.median(r[1] for r in runs):.0f} ms, max {slowest[1]:.0f} ms ({slowest[2]})")


if __name__ == "__main__":
    main()
