"""Render the lineup panel from a lab run to a PNG, so a reader sees the collapse without Grafana.

    sudo .venv/bin/python dashboards/preview.py                 # writes docs/lineup.png (~2 minutes)
    sudo .venv/bin/python dashboards/preview.py --output /tmp/x.png

It runs the lab of the query test (dashboards/lab_run.py: a loop device on a file on ext4 on
another loop device; healthy, collapsed and fsync phases), then runs the lineup panels' own
queries from the committed dashboard JSON, variables substituted as Grafana would, and draws
them with matplotlib: average request size per layer (the lineup panel), IOPS per layer, and
the collapse pages (the dashboard's annotation query) as red marks. Only the two lab loop
devices are drawn; the disk under them also carries the rest of the machine's I/O.
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import blockstack_dashboard  # noqa: E402
import lab_run  # noqa: E402
from grafana_sim import Grafana  # noqa: E402

DEFAULT_OUTPUT = os.path.join(os.path.dirname(HERE), "docs", "lineup.png")
PHASE_COLOURS = {"healthy": "#2ca02c", "collapsed": "#d62728", "fsync": "#1f77b4"}
PHASE_LABELS = {"healthy": "healthy: nomerges=0", "collapsed": "collapsed: lower nomerges=2, max_sectors_kb=4",
                "fsync": "fsync writes (ext4/jbd2)"}


def panel(dashboard, prefix):
    return next(p for p in dashboard["panels"] if p["title"].startswith(prefix))


def collect(lab, dashboard):
    g = Grafana(lab.stack.url("prometheus"), dashboard, lab.start, lab.end,
                scrape_interval=float(lab_run.SCRAPE_INTERVAL.rstrip("s")))
    g.choose("datasource", blockstack_dashboard.CONFIG["datasource_uid"])
    g.choose("host", lab.stack.host)
    g.choose("stack", lab.upper)
    g.choose("device", [lab.upper, lab.lower])
    out = {"upper": lab.upper, "lower": lab.lower, "start": lab.start, "end": lab.end, "phases": lab.phases}
    for key, prefix in (("size", "Average request size per layer"), ("iops", "IOPS per layer")):
        p = panel(dashboard, prefix)
        out[key] = g.query_range(p["targets"][0]["expr"], p.get("maxDataPoints"))[2]
    ann = [a for a in dashboard["annotations"]["list"] if not a.get("builtIn")][0]
    out["pages"] = g.query_range(ann["expr"])[2]
    return out


def draw(data, output):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    t0 = data["start"]
    role = {data["upper"]: "upper", data["lower"]: "lower"}
    colours = {data["upper"]: "#ff7f0e", data["lower"]: "#9467bd"}
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 7.2), sharex=True, dpi=110,
                                   gridspec_kw={"height_ratios": [3, 2]})
    fig.suptitle("Block Stack Merges - the lineup, from a lab run on loop devices", fontsize=14, fontweight="bold")

    def series(result):
        for s in sorted(result, key=lambda s: (s["metric"].get("depth", ""), s["metric"]["device"],
                                               s["metric"].get("operation", ""))):
            m = s["metric"]
            if m["device"] not in role or m.get("operation") not in ("read", "write"):
                continue
            xs = [float(t) - t0 for t, v in s["values"]]
            ys = [float(v) for t, v in s["values"]]
            if max(ys, default=0) <= 0:
                continue
            yield m, xs, ys

    for m, xs, ys in series(data["size"]):
        ax1.plot(xs, ys, color=colours[m["device"]], lw=2.2, ls="-" if m["operation"] == "read" else "--",
                 label=f"L{m['depth']} {m['device']} ({role[m['device']]}) {m['operation']}s")
    ax1.axhline(blockstack_dashboard.CONFIG["collapse_max_sectors"], color="#d62728", lw=1, ls=":")
    ax1.text(1, blockstack_dashboard.CONFIG["collapse_max_sectors"] * 1.12, "collapse threshold (16 sectors)",
             color="#d62728", fontsize=8)
    ax1.set_yscale("log", base=2)
    ax1.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax1.set_ylim(2, 1024)
    ax1.set_ylabel("avg request size\n(512-byte sectors)")
    ax1.set_title("Average request size per layer: upper stays at 256 sectors, lower drops to 8 when merging "
                  "breaks", fontsize=10)

    for m, xs, ys in series(data["iops"]):
        ax2.plot(xs, ys, color=colours[m["device"]], lw=2, ls="-" if m["operation"] == "read" else "--",
                 label=f"{m['device']} ({role[m['device']]}) {m['operation']}s")
    ax2.set_yscale("log")
    ax2.set_ylim(bottom=10)
    ax2.set_ylabel("requests / s")
    ax2.set_xlabel("seconds since the start of the lab run (rates over 20 s windows trail the phases)")
    ax2.set_title("IOPS per layer: the lower device serves ~30x more, smaller requests for the same bytes",
                  fontsize=10)

    for ax in (ax1, ax2):
        for name, (a, b) in data["phases"].items():
            ax.axvspan(a - t0, b - t0, color=PHASE_COLOURS[name], alpha=0.08, lw=0)
        ax.grid(True, which="major", alpha=0.3)
    for name, (a, b) in data["phases"].items():
        ax1.text((a + b) / 2 - t0, 700, PHASE_LABELS[name], ha="center", fontsize=8.5,
                 color=PHASE_COLOURS[name], fontweight="bold")
    fired = sorted({float(t) for s in data["pages"] for t, _ in s["values"]})
    if fired:
        names = sorted({s["metric"]["alertname"] for s in data["pages"]})
        ax1.axvline(fired[0] - t0, color="#d62728", lw=1.5)
        ax2.axvline(fired[0] - t0, color="#d62728", lw=1.5)
        ax1.text(fired[0] - t0 + 0.8, 3, "page: " + ", ".join(names), color="#d62728", fontsize=8.5)
    ax1.legend(loc="center left", fontsize=8.5, framealpha=0.9)
    ax2.legend(loc="upper left", fontsize=8.5, framealpha=0.9, ncol=2)
    ax2.set_xlim(0, data["end"] - t0)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", default=DEFAULT_OUTPUT)
    ap.add_argument("--data", help="also write (or, with --from-data, read) the queried data as JSON here")
    ap.add_argument("--from-data", action="store_true", help="redraw from --data without a lab run")
    args = ap.parse_args(argv)
    with open(blockstack_dashboard.OUTPUT) as f:
        dashboard = json.load(f)
    if args.from_data:
        with open(args.data) as f:
            data = json.load(f)
    else:
        with tempfile.TemporaryDirectory(prefix="dashboard-preview-") as work, lab_run.lab_run(work) as lab:
            data = collect(lab, dashboard)
        if args.data:
            with open(args.data, "w") as f:
                json.dump(data, f)
    draw(data, args.output)
    print(f">> wrote {os.path.relpath(args.output)}")


if __name__ == "__main__":
    main()
