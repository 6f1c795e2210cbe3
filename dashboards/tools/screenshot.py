"""The README pictures from real Grafana: the dashboard opened in Grafana + chromium during a
collapse, every panel loaded, and the top of the dashboard (firing alerts, the stack table, the
lineup) written to a PNG. Two labs:

- the loop lab (blockstack_lab/dashboard_lab.py, default): $stack on the lab's upper loop device;
  only the two loop devices are selected ($device): the root disk beneath them carries the rest of
  the machine's I/O. docs/dashboard.png.
- the VM lab (--vm KERNEL, blockstack_lab/vm_scenarios.nvme_collapse): the NVMe incident in a
  Debian guest: the LVM snapshot vg0/snap (4 KiB chunks) over emulated nvme0n1, read through
  while nvme0n1 goes nomerges 0 -> 2; the exporters in the guest, Prometheus, Alertmanager, the
  receiver and Grafana on the host. $stack is the snapshot (vg0-snap), $device the snapshot's dm-N
  and nvme0n1. docs/dashboard-vm.png; the picture reaches down to the snapshot panels.

    sudo .venv/bin/python dashboards/tools/screenshot.py                   # docs/dashboard.png (~3 minutes)
    make dashboard-screenshot                                         # the same
    make dashboard-screenshot-vm                                      # --vm 6.1: docs/dashboard-vm.png (~6-10 minutes)
    .venv/bin/python dashboards/tools/screenshot.py --ranges          # docs/dashboard-15m.png, -24h.png, -7d.png (~2 minutes)

--ranges: a week of the loop lab's stack backfilled into Prometheus (lab/blockstack_lab/week_history.py,
no root, no lab run), the top of the dashboard down to the lineup at 15 minutes, 24 hours and 7
days around the stack's first minutes: its 42 s split collapse 40 s after it appeared, then 3
minutes later its 36 s refused-merge collapse (at 7 days also the week-old stack's pair, mid-week),
each at its true peak at every range (test_grafana_week.py checks it on the same week).
"""

import argparse
import contextlib
import os
import tempfile

import blockstack_dashboard
from blockstack_deploy.files import secret
from blockstack_deploy.stack import Stack
from blockstack_lab import dashboard_lab, vm, vm_scenarios, week_history
from blockstack_lab.grafana_browser import Browser

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_OUTPUT = os.path.join(REPO, "docs", "dashboard.png")
VM_OUTPUT = os.path.join(REPO, "docs", "dashboard-vm.png")
WIDTH, HEIGHT = 1500, 1900
LAST_ROW = (
    "Merge ratio per layer"  # the loop lab's picture ends below this panel: the lineup row's last
)
VM_LAST_ROW = "Snapshot state"  # the VM lab's: below the snapshot panels


@contextlib.contextmanager
def loop_lab(work):
    """(Grafana URL, admin password, dashboard URL parameters, last panel) during a loop-lab
    collapse."""
    with dashboard_lab.collapse(work) as lab:
        # from the lab's start: the healthy, fsync and collapsed phases fill the width
        yield (
            lab.stack.url("grafana"),
            lab.grafana_password,
            {
                "from": int((lab.start - 20) * 1000),
                "var-host": lab.stack.host,
                "var-stack": lab.upper,
                "var-device": [lab.upper, lab.lower],
            },
            LAST_ROW,
        )


@contextlib.contextmanager
def vm_lab(work, kernel):
    """The same during the NVMe incident on Debian's `kernel` in the VM lab."""
    vm.sweep_stale()
    with vm.Guest(kernel, nvme=1) as guest, vm_scenarios.nvme_collapse(guest, work) as lab:
        # from the reads' start: the healthy and the collapsed phases side by side
        yield (
            lab.stack.url("grafana"),
            secret(lab.stack.grafana_password_file),
            {
                "from": int((lab.start - 20) * 1000),
                "var-host": lab.stack.host,
                "var-stack": "vg0-snap",
                "var-device": [lab.snap, "nvme0n1"],
            },
            VM_LAST_ROW,
        )


def shoot(b, params, last_row, output):
    """Open the dashboard with params, every panel loaded, and write its top down to last_row."""
    b.open_dashboard(
        blockstack_dashboard.CONFIG["uid"], {"orgId": 1, "to": "now", "refresh": "", **params}
    )
    b.page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    states = b.load_every_panel()
    bad = {t: s for t, s in states.items() if s["error"]}
    if bad:
        raise SystemExit(f"panels in error: {bad}")
    b.page.mouse.wheel(0, -100000)
    b.page.wait_for_timeout(2000)
    box = b.panel(last_row).bounding_box()
    if (
        box["y"] + box["height"] + 8 > HEIGHT
    ):  # Grafana draws only what is in view: the viewport down to it
        b.page.set_viewport_size({"width": WIDTH, "height": int(box["y"] + box["height"] + 8)})
        b.page.wait_for_timeout(5000)
        box = b.panel(last_row).bounding_box()
    b.page.screenshot(
        path=output, clip={"x": 0, "y": 0, "width": WIDTH, "height": box["y"] + box["height"] + 8}
    )
    print(f">> wrote {os.path.relpath(output)}")


def ranges(work):
    """docs/dashboard-RANGE.png at 15 min, 24 h and 7 days of the backfilled week (week_history),
    each view holding the new stack's two collapses (week_history.views)."""
    t = week_history.build(work, os.path.join(work, "prometheus"))
    stack = Stack(work, components=("prometheus", "grafana"), scrape_interval="5s")
    with (
        stack.running(timeout=120),
        Browser(
            stack.url("grafana"), secret(stack.grafana_password_file), viewport=(WIDTH, HEIGHT)
        ) as b,
    ):
        b.login()
        b.page.evaluate(
            "localStorage.setItem('grafana.navigation.docked', 'false')"
        )  # no side menu
        for name, (start, end) in week_history.views(t, "new").items():
            shoot(
                b,
                {
                    "from": start * 1000,
                    "to": end * 1000,
                    "var-host": week_history.HOST,
                    "var-stack": week_history.UPPER,
                    "var-device": [week_history.UPPER, week_history.LOWER],
                },
                LAST_ROW,
                os.path.join(REPO, "docs", f"dashboard-{name}.png"),
            )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--vm",
        metavar="KERNEL",
        help="the VM lab's NVMe incident on Debian's KERNEL (5.10, 6.1, 6.12 or sid)",
    )
    ap.add_argument(
        "--ranges",
        action="store_true",
        help="a backfilled week's collapses: docs/dashboard-15m.png, -24h.png and -7d.png",
    )
    ap.add_argument("--output")
    args = ap.parse_args(argv)
    if args.ranges:
        with tempfile.TemporaryDirectory(prefix="blockstack-screenshot-") as work:
            ranges(work)
        return
    output = args.output or (VM_OUTPUT if args.vm else DEFAULT_OUTPUT)
    with (
        tempfile.TemporaryDirectory(prefix="blockstack-screenshot-") as work,
        vm_lab(work, args.vm) if args.vm else loop_lab(work) as (url, password, params, last_row),
        Browser(url, password, viewport=(WIDTH, HEIGHT)) as b,
    ):
        b.login()
        b.page.evaluate(
            "localStorage.setItem('grafana.navigation.docked', 'false')"
        )  # no side menu
        shoot(b, params, last_row, output)


if __name__ == "__main__":
    main()
