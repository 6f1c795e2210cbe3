"""The README picture from real Grafana: a lab collapse (blockstack_lab/dashboard_lab.py), the dashboard
opened in Grafana + chromium with $stack on the lab's upper loop device, every panel loaded, and
the top of the dashboard (firing alerts, the stack table, the lineup) written to a PNG. Only the two
loop devices are selected ($device): the root disk beneath them carries the rest of the machine's I/O.

    sudo .venv/bin/python dashboards/tools/screenshot.py                   # docs/dashboard.png (~3 minutes)
    make dashboard-screenshot                                         # the same
"""
import argparse
import os
import tempfile

import blockstack_dashboard
from blockstack_lab import dashboard_lab
from blockstack_lab.grafana_browser import Browser

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_OUTPUT = os.path.join(REPO, "docs", "dashboard.png")
WIDTH = 1500
LAST_ROW = "Merge ratio per layer"  # the picture ends below this panel: the lineup row's last


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", default=DEFAULT_OUTPUT)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="blockstack-screenshot-") as work, \
            dashboard_lab.collapse(work) as lab, \
            Browser(lab.stack.url("grafana"), lab.grafana_password, viewport=(WIDTH, 1900)) as b:
        b.login()
        b.page.evaluate("localStorage.setItem('grafana.navigation.docked', 'false')")  # no side menu
        # from the lab's start: the healthy, fsync and collapsed phases fill the width
        # the two loop devices only: the root disk beneath them carries the rest of the machine's I/O
        params = {"orgId": 1, "from": int((lab.start - 20) * 1000), "to": "now", "var-host": lab.stack.host,
                  "var-stack": lab.upper, "var-device": [lab.upper, lab.lower], "refresh": ""}
        b.open_dashboard(blockstack_dashboard.CONFIG["uid"], params)
        states = b.load_every_panel()
        bad = {t: s for t, s in states.items() if s["error"]}
        if bad:
            raise SystemExit(f"panels in error: {bad}")
        b.page.mouse.wheel(0, -100000)
        b.page.wait_for_timeout(2000)
        box = b.panel(LAST_ROW).bounding_box()
        b.page.screenshot(path=args.output, clip={"x": 0, "y": 0, "width": WIDTH, "height": box["y"] + box["height"] + 8})
    print(f">> wrote {os.path.relpath(args.output)}")


if __name__ == "__main__":
    main()
