"""A week of one host's history for the dashboard, backfilled into a Prometheus TSDB with
`promtool tsdb create-blocks-from openmetrics`: the loop lab's stack (loop1 on a file on ext4 on
loop0) under steady sequential reads for seven days, and two pairs of collapses of loop0 at known
times, each a split collapse (max_sectors_kb=4: pieces split off every bio) followed three minutes
later by a refused-merge collapse (nomerges=2):

  "new": the stack appears at `appeared` and splits 40 s later, as in the lab run whose 24 h view
         showed the split collapse at 0 (docs/dashboard.md, "Truthful at every range"): a device
         that collapses in its first minutes (a new snapshot, a new LV, the lab);
  "old": mid-week, on the same stack four days old.

Series are named and labelled as the exporters publish them (blockstack-exporter's stack series,
node_exporter's diskstats, ebpf_exporter's block counters with `devno`) and as the recording
rules of alerts/recording.rules.yml record them (host_device_operation:*:rate, the 20 s windows of
`rate_window`, host_devno:blockstack_device:info); the panels read the recorded ones. Each
recorded rate at t is its counter's increase over (t - 20 s, t] / 20 s, as rate() makes it of a
counter sampled inside the window, so a collapse of 30 s or more reaches its exact rate (the rate
in timeline()'s `collapses`). No ALERTS: a backfill cannot write the staleness marker Prometheus
writes when an alert ends, and the pages' bands would last the 5-minute lookback longer.

Resolution: every 5 s (the stack's scrape and evaluation interval) within half an hour of each
collapse; elsewhere the recorded series every 15 s, the exporters' counters every 30 s and their
constant series (stack, queue settings) every 2 minutes, which keeps the backfill at ~1M samples
(~20 s of promtool). A real week at 5 s holds three times the
recorded samples, so a 7-day query here reads a third of what it would read in production.

    .venv/bin/python -m blockstack_lab.week_history DIR   # write DIR/week.om and the TSDB DIR/prometheus
"""

import math
import os
import subprocess
import sys
import time
import types

HOST = "lab"
WEEK = 7 * 86400
WINDOW = 20  # the recording rules' rate_window, seconds (alerts/config.yml)
# sample intervals: near a collapse, recorded series, the exporters' counters, their constant series
FINE, COARSE, SPARSE, CONSTANT = 5, 15, 30, 120
NEAR = 1800  # seconds around each collapse sampled every FINE
ALIGN = 1200  # the collapses' times relative to a multiple of 20 min (the 7-day step; see timeline)
UPPER, LOWER = "loop1", "loop0"
DEVNO = {UPPER: ("7:1", "1793"), LOWER: ("7:0", "1792")}  # st_rdev of 7:N is 7 << 8 | N
BASE = {UPPER: 400.0, LOWER: 400.0}  # healthy read requests per second (256 sectors each)
SECTORS = 256


def timeline(now=None):
    """The week's known times (Unix seconds) and each collapse's rate (events per second, the true
    peak a panel must show). The stack appears `ALIGN` s after a multiple of 20 minutes less 30 s,
    so that at every range Grafana's interval containing the "new" split collapse starts before the
    stack existed (at 24 h the interval is 2 minutes, at 7 days 20 minutes: the panels' width)."""
    now = time.time() if now is None else now
    end = math.floor((now - 600) / ALIGN) * ALIGN  # ten minutes of margin before Prometheus's head
    appeared = end - WEEK + 30
    collapses = {}
    for pair, split_at, split_rate, refused_rate in (
        ("new", appeared + 40, 131072.0, 98304.0),
        ("old", appeared + 4 * 86400 + 40, 61440.0, 45056.0),
    ):
        # 42 s of split pieces, then 3 minutes later 36 s of refused merges
        collapses[pair, "split"] = (split_at, split_at + 42, split_rate)
        refused_at = split_at + 42 + 180
        collapses[pair, "refused"] = (refused_at, refused_at + 36, refused_rate)
    return types.SimpleNamespace(appeared=appeared, end=end, collapses=collapses)


def views(t, pair):
    """{name: (from, to)} (Unix seconds) of the views at 15 min, 24 h and 7 days that hold the
    collapse pair `pair`, each collapse inside, away from the edges; the 7 days from a day before
    the stack appeared, so that the new pair is not at the graph's edge (and the old pair inside)."""
    split = t.collapses[pair, "split"][0]
    return {
        "15m": (split - 300, split + 600),
        "24h": (split - 20 * 3600, split + 4 * 3600),
        "7d": (t.appeared - 86400, t.appeared + 6 * 86400),
    }


def _times(t, step):
    """Sample times from the stack's appearance to the end: every `step` s, every FINE s near a
    collapse."""
    near = [(start - NEAR, stop + NEAR) for start, stop, _ in t.collapses.values()]
    out, s = [], t.appeared
    while s <= t.end:
        out.append(s)
        s += FINE if any(a <= s <= b for a, b in near) else step
    return out


def _rates(t):
    """{(device, series): rate function of time}: requests completed, bytes, merged bios, requests
    issued, refused merges and split-off pieces per second on each layer."""

    def healthy(device):
        # a day's cycle of load, so that seven days are not a flat line
        return lambda s: (
            BASE[device] * (1.25 + 0.75 * math.sin(2 * math.pi * (s - t.appeared) / 86400))
        )

    def event(kind):
        def rate(s):
            return sum(r for (_, k), (a, b, r) in t.collapses.items() if k == kind and a <= s < b)

        return rate

    split, refused = event("split"), event("refused")
    out = {}
    for device in (UPPER, LOWER):
        base = healthy(device)
        if device == UPPER:
            out[device, "completed"] = base
            out[device, "missed"] = out[device, "splits"] = lambda s: 0.0
        else:
            # collapsed, the lower layer serves the pieces and refused requests as 8-sector ones
            out[device, "completed"] = lambda s, base=base: base(s) + split(s) + refused(s)
            out[device, "missed"], out[device, "splits"] = refused, split
        out[device, "issued"] = out[device, "completed"]
        out[device, "bytes"] = lambda s, base=base, lower=device == LOWER: (
            base(s) * SECTORS * 512 + (split(s) + refused(s)) * 8 * 512 * lower
        )
        out[device, "merged"] = lambda s, base=base: base(s) * 63  # 64 bios per request
    return out


def _counter(rate, start, stop):
    """The increase of a counter counting at `rate` between two times (1-second steps)."""
    return sum(rate(s + 0.5) for s in range(int(start), int(stop)))


def openmetrics(t):
    """The week as OpenMetrics text: (family, [(labels, [(time, value)])]) written family by family."""
    rates = _rates(t)
    coarse, sparse, constant = _times(t, COARSE), _times(t, SPARSE), _times(t, CONSTANT)
    families = {}

    def add(name, labels, points):
        families.setdefault(name, []).append((labels, points))

    bs = {"job": "blockstack", "instance": f"{HOST}:9363", "host": HOST}
    ebpf = {"job": "ebpf", "instance": f"{HOST}:9435", "host": HOST}
    node = {"job": "node", "instance": f"{HOST}:9100", "host": HOST}
    ones = [(s, 1) for s in constant]
    for device in (UPPER, LOWER):
        add(
            "blockstack_device_info",
            {
                **bs,
                "device": device,
                "kind": "loop",
                "name": device,
                "uuid": "",
                "vg_name": "",
                "lv_name": "",
                "lv_layer": "",
                "backing_file": f"/var/lib/lab/{device}.img",
            },
            ones,
        )
        add(
            "blockstack_device_holders",
            {**bs, "device": device},
            [(s, int(device == LOWER)) for s in constant],
        )
        major_minor, devno = DEVNO[device]
        add(
            "blockstack_device_number_info",
            {**bs, "device": device, "major_minor": major_minor, "devno": devno},
            ones,
        )
        # the queue settings of the stack table, as the lab leaves them between collapses
        for setting, value in (
            ("nomerges", 0),
            ("max_sectors_bytes", 1280 << 10),
            ("max_hw_sectors_bytes", 1280 << 10),
            ("read_ahead_bytes", 2560 << 10),
            ("rotational", 1),
        ):
            add(
                f"blockstack_queue_{setting}",
                {**bs, "device": device},
                [(s, value) for s in constant],
            )
        add("blockstack_queue_scheduler_info", {**bs, "device": device, "scheduler": "none"}, ones)
    for set_, config in (("block", "block_io"), ("jbd2", "jbd2_credit_wait")):
        add("blockstack_ebpf_set_loaded", {**bs, "set": set_, "config": config}, ones)
    add(
        "blockstack_device_beneath_info",
        {**bs, "device": UPPER, "lower": LOWER, "depth": "1"},
        ones,
    )

    # the exporters' counters, every SPARSE s (FINE near a collapse)
    raw = {
        "completed": ("node_disk_reads_completed_total", node),
        "bytes": ("node_disk_read_bytes_total", node),
        "merged": ("node_disk_reads_merged_total", node),
        "issued": ("ebpf_exporter_block_rq_size_bytes_count", ebpf),
        "missed": ("ebpf_exporter_block_rq_missed_merges_total", ebpf),
        "splits": ("ebpf_exporter_block_bio_splits_total", ebpf),
    }
    for series, (name, job) in raw.items():
        for device in (UPPER, LOWER):
            labels = (
                {**job, "device": device}
                if job is node
                else {**job, "devno": DEVNO[device][1], "operation": "read"}
            )
            total, last, points = 0.0, t.appeared, []
            for s in sparse:
                total += _counter(rates[device, series], last, s)
                last = s
                points.append((s, total))
            add(name, labels, points)

    # the recording rules' outputs (host_device_operation:*:rate), every COARSE s (FINE near a
    # collapse): the counter's increase over the rule's window
    recorded = {
        "completed": "host_device_operation:node_disk_completed:rate",
        "bytes": "host_device_operation:node_disk_bytes:rate",
        "merged": "host_device_operation:node_disk_merged:rate",
        "issued": "host_device_operation:ebpf_block_rq:rate",
        "missed": "host_device_operation:ebpf_block_rq_missed_merges:rate",
        "splits": "host_device_operation:ebpf_block_bio_splits:rate",
    }
    for series, name in recorded.items():
        for device in (UPPER, LOWER):
            rate = rates[device, series]
            points = [
                (s, _counter(rate, max(s - WINDOW, t.appeared), s) / WINDOW)
                for s in coarse
                if s - WINDOW >= t.appeared  # rate() needs two samples in its window
            ]
            add(name, {"host": HOST, "device": device, "operation": "read"}, points)
    for device in (UPPER, LOWER):
        major_minor, devno = DEVNO[device]
        add(
            "host_devno:blockstack_device:info",
            {"host": HOST, "devno": devno, "device": device},
            [(s, 1) for s in coarse],
        )

    lines = []
    for name, members in families.items():
        lines.append(f"# TYPE {name} gauge\n")
        for labels, points in members:
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines += [f"{name}{{{text}}} {v:.6g} {s}\n" for s, v in points]
    lines.append("# EOF\n")
    return "".join(lines)


def build(workdir, tsdb, now=None, log=print):
    """Write the week (workdir/week.om) and backfill it into the TSDB directory `tsdb` (a
    Prometheus's --storage.tsdb.path, created); returns its timeline()."""
    t = timeline(now)
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "week.om")
    started = time.monotonic()
    with open(path, "w") as f:
        f.write(openmetrics(t))
    os.makedirs(tsdb, exist_ok=True)
    # one block per day or more: fewer blocks for Prometheus to compact once it starts
    subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=48h",
            path,
            tsdb,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    log(
        f">> week history: {os.path.getsize(path) >> 20} MiB of OpenMetrics backfilled into {tsdb} in "
        f"{time.monotonic() - started:.0f} s"
    )
    return t


if __name__ == "__main__":
    build(sys.argv[1], os.path.join(sys.argv[1], "prometheus"))
