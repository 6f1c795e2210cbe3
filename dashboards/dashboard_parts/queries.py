"""The PromQL the panels share: the layers of the selected stack, the windows of a graph's
intervals, quantiles kept inside their histograms, and the stack table's settings."""

import os
import re

import yaml

from .common import SEL


# The layers of the selected stack ($stack is the top device's name: dm name for dm, else the
# kernel name), one series per device with its depth below the top (0 = top) and its names.
# Built from blockstack_device_beneath_info (the exporter's transitive closure of the stack), each
# selector passed through `at` (an instant vector selector by default: the stack table's now).
def layers(at=lambda selector: selector):
    beneath = at('blockstack_device_beneath_info{host="$host"}')
    top = at('blockstack_device_info{host="$host", name="$stack"}')
    info = at(f"blockstack_device_info{{{SEL}}}")
    return f"""max by (host, device, depth, name, kind, vg_name, lv_name, lv_layer) (
    (
        label_replace(
          {beneath}
            and on (host, device) {top},
          "device", "$1", "lower", "(.+)")
      or
        label_replace({top}, "depth", "0", "", "")
    )
  * on (host, device) group_left (name, kind, vg_name, lv_name, lv_layer)
    max by (host, device, name, kind, vg_name, lv_name, lv_layer) ({info})
)"""


LAYERS = layers()
LAYER_LEGEND = "L{{depth}} {{name}} {{operation}}"

# The $stack and $device variables' options (variables.py folds them onto one line).
STACK_QUERY = """query_result(max by (name) (
    blockstack_device_info{host="$host"}
      and on (host, device) (blockstack_device_holders{host="$host"} == 0)
      unless on (host, device) blockstack_device_info{host="$host", kind="loop", backing_file=""}
))"""

DEVICE_QUERY = """query_result(max by (device) (
    label_replace(
      blockstack_device_beneath_info{host="$host"}
        and on (host, device) blockstack_device_info{host="$host", name="$stack"},
      "device", "$1", "lower", "(.+)")
  or
    blockstack_device_info{host="$host", name="$stack"}
))"""

# The ebpf_exporter configs whose histograms the quantile panels read (bucket bounds).
EBPF_CONFIGS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "ebpf-configs"
)
BLOCK_IO = os.path.join(EBPF_CONFIGS, "block_io.yaml")
JBD2 = os.path.join(EBPF_CONFIGS, "jbd2_credit_wait.yaml")
# The per-cgroup counters' budget: named slots per device, the rest counted as "other".
BLOCK_CGROUPS = os.path.join(EBPF_CONFIGS, "block_cgroups.bpf.h")

# The interval of the graph that starts at each point (the step, from the point on): each sample
# falls in one. Grafana aligns a range's end down to a multiple of the step, so a window ending at
# each point never reaches the latest, partial interval (at 24 h the last 2 minutes: a collapse
# under way would not show); a point shows its interval, drawn at its start.
INTERVAL = "[$__interval] offset -$__interval"


def per_layer(expr):
    """expr's series with the layer's depth below the top and its name (legend LAYER_LEGEND), for
    the devices in the stack at any time of each point's interval (INTERVAL), not only at its
    start: expr's values come from the interval after the point, and layers taken at the point
    alone dropped the whole interval in which a stack appeared, with any collapse in it (the lab's
    split collapse 40 s after the stack's first scrape showed 0 at 24 h; a new snapshot, a new LV
    or a reboot do the same). The layers at the point itself too, where an interval holds no
    sample of the exporter's series (a missed scrape); one series per device (topk), should a
    device's depth or name change within an interval."""
    during = layers(lambda selector: f"max_over_time({selector}{INTERVAL})")
    return (
        f"{expr}\n  * on (host, device) group_left (depth, name)\n"
        f"topk by (host, device) (1,\n{during}\nor\n{LAYERS}\n)"
    )


def over(record):
    """sum_over_time of a recorded rate over each interval of the graph (weighted())."""
    return f"sum_over_time({record}{{{SEL}}}{INTERVAL})"


def weighted(numerator, denominator):
    """numerator / denominator of two recorded rates over each whole interval of the graph: an
    average weighted by the denominator's events. The rules' 20 s windows sampled at the graph's
    step would show one window per step and miss what happens between (over 24 h, at a 2-minute
    step, one in 6)."""
    return f"{over(numerator)}\n  / ({over(denominator)} > 0)"


def peak(record):
    """A recorded rate's highest value within each interval of the graph (INTERVAL): the peak per
    interval, at every range."""
    return f"max_over_time({record}{{{SEL}}}{INTERVAL})"


def with_traffic(expr):
    """expr for the devices and operations that issued requests (ebpf_exporter, block_rq_issue) in
    the interval, 0 where it has no series (an ebpf_exporter counter appears only once it counts),
    and wherever expr is above 0: a bio-based device (dm, md) issues no requests of its own, yet
    splits bios (a dm snapshot every one)."""
    issued = peak("host_device_operation:ebpf_block_rq:rate")
    return (
        f"(\n  ({expr} or {issued} * 0)\n    and on (host, device, operation) ({issued} > 0)\n"
        f"  or {expr} > 0\n)"
    )


def ebpf_rate(k, metric, extra="", window="$__rate_interval"):
    """rate() of an ebpf_exporter series, named: its series carry the device number (devno), and
    the rules' device map (host_devno:blockstack_device:info) gives the device's name now."""
    return (
        f'rate({metric}{{{k["ebpf_selector"]}, host="$host"{extra}}}[{window}])'
        f" * on (host, devno) group_left (device) host_devno:blockstack_device:info{{{SEL}}}"
    )


def cgroup_slots():
    """The named cgroups each device has counters for (CGROUP_SLOTS of block_cgroups.bpf.h)."""
    with open(BLOCK_CGROUPS) as f:
        (slots,) = re.findall(r"^#define CGROUP_SLOTS (\d+)", f.read(), re.M)
    return int(slots)


# The per-cgroup recording rules (alerts/recording.rules.yml) the "Whose I/O" panel reads.
CGROUP_BYTES = "host_device_operation_cgroup:ebpf_block_cgroup_bio_bytes:rate"
CGROUP_EVENTS = "host_device_operation_cgroup:ebpf_block_cgroup_collapse_events:rate"


def named_cgroups():
    """The cgroup_slots() cgroups of each device that by_cgroup() names, ranked once over the whole
    range of the graph (to its last interval, as INTERVAL reads it): first the cgroups with refused
    merges or split-off pieces, then the others, each by bytes. A ranking per point would name
    another cgroup at each point, and the legend would outgrow the panel on a busy disk."""

    def total(record):
        return (
            "sum by (host, device, cgroup) (sum_over_time("
            f'{record}{{{SEL}, cgroup!="other"}}[$__range] @ end() offset -$__interval))'
        )

    hurt = f"({total(CGROUP_EVENTS)} > bool 0\n    or {total(CGROUP_BYTES)} * 0)"
    # a hurt cgroup's score is its bytes plus its device's most bytes: above every other cgroup
    return (
        f"topk({cgroup_slots()},\n  {total(CGROUP_BYTES)}\n  + {hurt}\n"
        f"    * on (host, device) group_left max by (host, device) ({total(CGROUP_BYTES)})\n)"
    )


def by_cgroup(record):
    """A recorded rate per block cgroup (CGROUP_BYTES or CGROUP_EVENTS), reads and writes summed,
    averaged over each interval of the graph: the named_cgroups() by name and every other cgroup
    summed as "other" (the BPF's own "other", cgroups without a slot, and the named ones ranked
    lower): nothing counted is left out."""
    every = f"sum by (host, device, cgroup, parent) (avg_over_time({record}{{{SEL}}}{INTERVAL}))"
    named = named_cgroups()
    rest = f"sum by (host, device) (\n    {every}\n      unless on (host, device, cgroup) {named})"
    return (
        f"(\n  {every}\n    and on (host, device, cgroup) {named}\n"
        f'  or label_replace({rest},\n    "cgroup", "other", "", "")\n)'
    )


def observed(rate):
    """sum by (le) of a histogram's bucket rates, at the times some observation was made: an idle
    range is then empty, and the heatmap says so (widgets.heat())."""
    total = rate.replace("_bucket{", '_bucket{le="+Inf", ', 1)
    return f"sum by (le) ({rate})\n  and on () (sum({total}) > 0)"


def histogram_top(config, name):
    """Lower bound of the top finite bucket of an exp2 histogram of an ebpf_exporter config, in its
    unit: ebpf_exporter's exp2 maps put every value above the top bound into the top bucket, so a
    quantile that lands there (or in +Inf) is only "at least this", never a measured value."""
    with open(config) as f:
        metrics = yaml.safe_load(f)["metrics"]["histograms"]
    (h,) = [m for m in metrics if m["name"] == name]
    assert h["bucket_type"] == "exp2", h
    return 2 ** (h["bucket_max"] - 1) * float(h.get("bucket_multiplier", 1))


def in_range(q, buckets, name, config=BLOCK_IO):
    """histogram_quantile(q, buckets) where there were observations and the quantile falls below
    the top bucket (histogram_top): no line for an idle layer, none pinned at the histogram's
    top."""
    return f"(\n  histogram_quantile({q}, {buckets})\n    <= {histogram_top(config, name)!r}\n)"


def peak_quantile(q, buckets, name, window, config=BLOCK_IO):
    """in_range(q, buckets) at its highest within each interval of the graph, so that a p99 of a
    slow minute keeps its height over 24 h (a rate over the whole interval would dilute it): a
    subquery of the rates in `buckets` over `window`, stepped by `window` (back to back, every
    request in one of them). The step is explicit: a subquery's default is the server's evaluation
    interval (Thanos Query: 1m), sparser than an interval of the graph. Its panel's minimum
    interval is `window` (widgets.ts(interval=)), so every interval holds a step."""
    return (
        f"max_over_time({in_range(q, buckets, name, config)}[$__interval:{window}] "
        "offset -$__interval)"
    )


# --- the stack table's columns (stack_table.py) ---------------------------------------------


def setting(row, k):
    """A queue setting's value per device (a SETTINGS row), as its column shows it: the metric
    divided by the column's divisor."""
    divide = f" / {row.column.divisor}" if row.column.divisor != 1 else ""
    return f"max by (host, device) ({row.name}{{{k['blockstack_selector']}, {SEL}}}){divide}"


def plus_10_beneath(value, k):
    """value, plus 10 on a device beneath another one (nomerges: the check and the alert warn
    there, nomerges_beneath_stack, and only inform elsewhere)."""
    beneath = (
        f"label_replace(max by (host, lower) (blockstack_device_beneath_info{{"
        f'{k["blockstack_selector"]}, host="$host", lower=~"$device"}}), "device", "$1", "lower", '
        '"(.+)")'
    )
    return (
        f"{value}\n  + on (host, device) 10 * ({beneath} * 0 + 1 or on (host, device) {value} * 0)"
    )


def scheduler(k):
    """The active I/O scheduler per device, as the label `scheduler` (the value is 1)."""
    return (
        "max by (host, device, scheduler) "
        f"(blockstack_queue_scheduler_info{{{k['blockstack_selector']}, {SEL}}} == 1)"
    )
