"""The "Block Stack Merges" Grafana dashboard, generated from code with grafana-foundation-sdk.

    .venv/bin/python dashboards/blockstack_dashboard.py            # rewrite dashboards/block-stack-merges.json
    .venv/bin/python dashboards/blockstack_dashboard.py --check    # exit 1 if the committed JSON is stale
    make generate                                                  # the same, and the rules

Never edit the JSON by hand: edit this file and regenerate. Selectors, thresholds and windows
are the knobs of alerts/config.yml, shared with the rules (blockstack_rules.knobs); the
dashboard's own identity is in CONFIG below. Every panel description quotes the incidents
(the LVM-snapshot-on-NVMe incident, the ext4 dioread_nolock incident, the lvm2 snapshot
write-up) so a newcomer knows what healthy and sick look like. See docs/dashboard.md.
"""

import argparse
import difflib
import json
import os
import sys

import yaml
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

from blockstack_rules import knobs

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT = os.path.join(HERE, "block-stack-merges.json")

# --- The dashboard's identity (its thresholds and selectors are knobs of alerts/config.yml). -----
CONFIG = {
    # Stable identity: links, provisioning and alert runbooks point at this uid. Never change it.
    "uid": "blockstack-merges",
    "title": "Block Stack Merges",
    # uid and name of the provisioned Prometheus datasource (deploy/grafana/provisioning/datasources/).
    # The $datasource variable starts on the datasource of this name in a provisioned copy, and on
    # the one chosen for the DS_PROMETHEUS input in an imported copy; any Prometheus can be picked.
    "datasource_uid": "blockstack-prometheus",
    "datasource_name": "Prometheus (Block Stack Merges)",
    # Alert names whose firing draws an annotation on the lineup panels (a regex): the merge
    # collapse page of alerts/alerts.rules.yml. Change it with it.
    "collapse_alerts": "BlockStackMergeCollapse.*",
    # Time range and refresh the dashboard opens with.
    "time_from": "now-1h",
    "refresh": "30s",
}

# The colour of a finding's severity (blockstack_finding, blockstack-doctor, the alerts' severity
# label); a setting no check finds anything in is green. Every panel that colours a setting
# colours it as the check of checks.py judges it at the knobs' thresholds, so the dashboard, the
# doctor and the settings alerts never disagree; red is for what pages (critical) only
# (dashboards/tests/test_dashboard_structure.py: test_settings_take_their_findings_colours).
SEVERITY_COLOURS = {"critical": "red", "warning": "orange", "info": "blue"}
HEALTHY = "green"
INFO, WARNING = SEVERITY_COLOURS["info"], SEVERITY_COLOURS["warning"]
# Series colours. Red is the alarm's (the collapse pages' bands, the pages' floors, a critical
# finding), so no ordinary series may take it, as Grafana's classic palette gives the fifth one: a
# series is a shade of blue, and on the lineup each layer keeps one colour in every panel (by the
# L<depth> of LAYER_LEGEND; writes dashed).
SERIES_COLOURS = {"mode": "shades", "fixedColor": "blue"}
LAYER_COLOURS = ["blue", "purple", "yellow", "green", "super-light-blue", "super-light-purple"]

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'host="$host", device=~"$device"'

# The layers of the selected stack ($stack is the top device's name: dm name for dm, else the
# kernel name), one series per device with its depth below the top (0 = top) and its names.
# Built from blockstack_device_beneath_info (the exporter's transitive closure of the stack).
LAYERS = f"""max by (host, device, depth, name, kind, vg_name, lv_name, lv_layer) (
    (
        label_replace(
          blockstack_device_beneath_info{{host="$host"}}
            and on (host, device) blockstack_device_info{{host="$host", name="$stack"}},
          "device", "$1", "lower", "(.+)")
      or
        label_replace(blockstack_device_info{{host="$host", name="$stack"}}, "depth", "0", "", "")
    )
  * on (host, device) group_left (name, kind, vg_name, lv_name, lv_layer)
    max by (host, device, name, kind, vg_name, lv_name, lv_layer) (blockstack_device_info{{{SEL}}})
)"""

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
BLOCK_IO = os.path.join(os.path.dirname(HERE), "ebpf-configs", "block_io.yaml")
JBD2 = os.path.join(os.path.dirname(HERE), "ebpf-configs", "jbd2_credit_wait.yaml")


# Pixels the alert name column keeps: 8 per character of the longest name
# (BlockStackPrometheusNotConnectedToAlertmanagers, 47) and the cell's padding.
ALERT_NAME_WIDTH = 400


# --- Small helpers ---------------------------------------------------------------------------------


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
    """histogram_quantile(q, buckets) where there were observations and the quantile falls below the
    top bucket (histogram_top): no line for an idle layer, none pinned at the histogram's top."""
    return f"(\n  histogram_quantile({q}, {buckets})\n    <= {histogram_top(config, name)!r}\n)"


def q(expr, legend="", ref="A", fmt=None, instant=False):
    t = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        t = t.legend_format(legend)
    if fmt:
        t = t.format(fmt)
    return t.instant() if instant else t.range()


def table_q(expr, ref="A"):
    """An instant query whose result a table panel shows."""
    return q(expr, ref=ref, fmt=pm.PromQueryFormat.TABLE, instant=True)


def steps(*pairs):
    return (
        db.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=v, color=c) for v, c in pairs])
    )


def legend_table(calcs=("mean", "max", "lastNotNull"), placement=cm.LegendPlacement.RIGHT):
    return (
        cb.VizLegendOptions()
        .display_mode(cm.LegendDisplayMode.TABLE)
        .placement(placement)
        .show_legend(True)
        .calcs(list(calcs))
    )


def ts(title, description, targets, unit, w=12, h=9, no_value="No data in this time range", **kw):
    """A time series panel with its legend as a table on the right, where every series has a row
    (a legend beneath a graph gets at most a third of the panel's height: 2 or 3 rows)."""
    p = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(w)
        .height(h)
        .line_width(2)
        .fill_opacity(10)
        .no_value(no_value)
        .color_scheme(
            db.FieldColor().mode(SERIES_COLOURS["mode"]).fixed_color(SERIES_COLOURS["fixedColor"])
        )
        .legend(legend_table())
        .tooltip(
            cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
        )
    )
    for t in targets:
        p = p.with_target(t)
    if "min" in kw:
        p = p.min(kw["min"])
    if "max" in kw:
        p = p.max(kw["max"])
    if "interval" in kw:  # the minimum $__interval (a peak_quantile's step)
        p = p.interval(kw["interval"])
    if "log" in kw:
        p = p.scale_distribution(
            cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG).log(kw["log"])
        )
    if "thresholds" in kw:
        p = p.thresholds(kw["thresholds"]).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.DASHED)
        )
    return p


def layer_colours(p):
    """Each layer's colour (LAYER_COLOURS) on a panel whose legends carry L<depth>; writes dashed."""
    for depth, colour in enumerate(LAYER_COLOURS):
        p = p.override_by_regexp(
            f".*\\bL{depth} .*", [prop("color", {"mode": "fixed", "fixedColor": colour})]
        )
    return p.override_by_regexp(
        ".* write$", [prop("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})]
    )


def heat(title, description, target, unit, w=8, h=8, repeat=True, cell_unit="reqps"):
    """A heatmap of histogram buckets, `target` only where there were observations (observed()): an
    empty one says "No data" (Grafana 12's heatmap shows its own words, not a noValue), where buckets
    of zeros drew an empty colour scale, "∞undefined req/s ... -∞undefined req/s"."""
    p = (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(w)
        .height(h)
        .with_target(target)
        .calculate(False)
        .color(
            heatmap.HeatmapColorOptions()
            .mode(hm.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .scale(hm.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
        )
        .y_axis(heatmap.YAxisConfig().unit(unit).decimals(0))
        .cell_values(heatmap.CellValues().unit(cell_unit))
        .show_legend()
        .show_tooltip()
        .show_y_histogram()
        .max_data_points(120)
    )
    if repeat:
        p = p.repeat("device").repeat_direction("h")
    return p


def stat_panel(title, description, targets, unit, w=6, h=4, thresholds=None, no_value="No data"):
    p = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(w)
        .height(h)
        .no_value(no_value)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    for t in targets:
        p = p.with_target(t)
    if thresholds:
        p = p.thresholds(thresholds)
    return p


def prop(id_, value):
    return dm.DynamicConfigValue(id_val=id_, value=value)


def color_cells():
    return prop("custom.cellOptions", {"type": "color-background", "mode": "basic"})


def value_map(mapping):
    """{value: (text, color)} -> a Grafana value mapping."""
    return [
        dm.ValueMap(
            options={
                str(k): dm.ValueMappingResult(text=t, color=c, index=i)
                for i, (k, (t, c)) in enumerate(mapping.items())
            }
        )
    ]


def organize(exclude=(), rename=None, order=None):
    return dm.DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {k: True for k in exclude},
            "renameByName": rename or {},
            "indexByName": {k: i for i, k in enumerate(order or [])},
        },
    )


def merge():
    return dm.DataTransformerConfig(id_val="merge", options={})


def sort_by(field):
    return dm.DataTransformerConfig(
        id_val="sortBy", options={"fields": {}, "sort": [{"field": field}]}
    )


# --- Panels ----------------------------------------------------------------------------------------


def alert_panels(k):
    firing = (
        'ALERTS{alertstate="firing", host="$host", device=~"$device"}\n'
        '  or ALERTS{alertstate="firing", host="$host", device=""}'
    )
    return [
        table.Panel()
        .title("Firing alerts")
        .datasource(DS)
        .span(12)
        .height(5)
        .description(
            "Alerts firing now for this host: those about a device of the selected stack, and those about the host "
            "as a whole (an exporter down). Healthy: the table is empty. Sick: BlockStackMergeCollapse* means a layer "
            "of this stack is splitting or not merging requests (the NVMe incident: dm-3 at 512 sectors per request "
            "over nvme1n1 at 8, 27x slower reads); its runbook link is in the alert's annotations. The lineup panels "
            "below carry a red annotation for each such page."
        )
        .with_target(table_q(firing))
        .with_transformation(
            organize(
                exclude=["Time", "Value", "__name__", "alertstate", "job", "instance"],
                order=["alertname", "severity", "host", "device"],
            )
        )
        .no_value("No alert is firing for this stack.")
        # a page's row in its severity's colour (red: critical), its name in full
        .override_by_name(
            "severity",
            [
                prop(
                    "mappings",
                    [
                        m.to_json()
                        for m in value_map({s: (s, c) for s, c in SEVERITY_COLOURS.items()})
                    ],
                ),
                prop(
                    "custom.cellOptions",
                    {"type": "color-background", "mode": "basic", "applyToRow": True},
                ),
            ],
        )
        .override_by_name("alertname", [prop("custom.minWidth", ALERT_NAME_WIDTH)])
        # a host-wide alert has no device or operation: its cells empty, not the panel's empty state
        .override_by_name("device", [prop("noValue", "")])
        .override_by_name("operation", [prop("noValue", "")]),
        findings_panel(k),
        evidence_panel(k),
    ]


def evidence_panel(k):
    """blockstack_ebpf_set_loaded{set, config}: which BPF programs this host's kernel runs. The
    collapse page rests on the block set; where it is not loaded nothing can page, and the row is
    in BlockStackCollapseEvidenceMissing's colour (a warning)."""
    return (
        table.Panel()
        .title("eBPF evidence")
        .datasource(DS)
        .span(24)
        .height(4)
        .description(
            "The sets of BPF programs this host's kernel loads (ebpf-configs/select-configs.sh at the stack's "
            "start): block (block_io, or block_io_immediate before Linux 5.17) counts refused merges and "
            "split-off pieces, the evidence every merge-collapse page rests on; jbd2 times journal credit waits. "
            "Healthy: both loaded (Linux 5.10 to 5.16: block_io_immediate). Sick: 'not loaded', no variant loads "
            "on this kernel (before 5.10, or no BTF): no collapse can page on this host (alert "
            "BlockStackCollapseEvidenceMissing); the loaders' errors are in blockstack_ebpf_variant_failed_info "
            "and STATE_DIR/ebpf-status.tsv."
        )
        .with_target(
            table_q(
                f"max by (set, config) (blockstack_ebpf_set_loaded{{{k['blockstack_selector']}, "
                f'host="$host"}})'
            )
        )
        .with_transformation(
            organize(
                exclude=["Time"],
                rename={"config": "variant running", "Value": "state"},
                order=["set", "config", "Value"],
            )
        )
        .override_by_name(
            "state",
            [
                prop(
                    "mappings",
                    [
                        m.to_json()
                        for m in value_map({1: ("loaded", HEALTHY), 0: ("not loaded", WARNING)})
                    ],
                ),
                color_cells(),
            ],
        )
        .no_value(
            "No status: the stack did not probe the kernel (ebpf_exporter run by other means), or "
            "blockstack-exporter is down."
        )
    )


def findings_panel(k):
    """blockstack_finding{device, check, severity}: 1 per active misconfiguration finding of the
    exporter's checks (the table blockstack-doctor prints)."""
    return (
        table.Panel()
        .title("Findings")
        .datasource(DS)
        .span(12)
        .height(5)
        .description(
            "Misconfigurations the exporter finds on the stack's devices now (the checks of blockstack-doctor: "
            "one row per device and check). Healthy: no finding. Sick: e.g. nomerges 2 beneath a stack (the NVMe "
            "incident: nvme1n1 with QUEUE_FLAG_NOMERGES, 8-sector requests, 27x slower reads), a max_sectors_kb "
            "far below max_hw_sectors_kb, 4 KiB snapshot chunks (LVM2 write-up: 625 s vs 55 s for 1 GB), or "
            "dioread_nolock with a small journal (ext4 incident: 20,026 -> 315 IOPS). `blockstack-doctor "
            "--device DEV` prints each finding's evidence and fix."
        )
        .with_target(
            table_q(
                f"max by (host, device, check, severity) "
                f"(blockstack_finding{{{k['blockstack_selector']}, {SEL}}} == 1)"
            )
        )
        .with_transformation(
            organize(exclude=["Time", "Value", "host"], order=["device", "check", "severity"])
        )
        .with_transformation(sort_by("device"))
        .override_by_name(
            "severity",
            [
                prop(
                    "mappings",
                    [
                        m.to_json()
                        for m in value_map({s: (s, c) for s, c in SEVERITY_COLOURS.items()})
                    ],
                ),
                color_cells(),
            ],
        )
        .no_value("No finding: the checks found no misconfiguration on this stack.")
    )


def stack_table(k):
    BS = f"{k['blockstack_selector']}, {SEL}"
    kb = "/ 1024"
    nomerges = f"max by (host, device) (blockstack_queue_nomerges{{{BS}}})"
    # nomerges, plus 10 on a device beneath another one: the check (and the alert) warns there
    # (nomerges_beneath_stack) and only informs elsewhere (nomerges); the mapping shows the setting
    beneath = (
        f"label_replace(max by (host, lower) (blockstack_device_beneath_info{{{k['blockstack_selector']}, "
        f'host="$host", lower=~"$device"}}), "device", "$1", "lower", "(.+)")'
    )
    targets = [
        table_q(expr, ref)
        for ref, expr in zip(
            "ABCDEF",
            [
                LAYERS,
                f"{nomerges}\n  + on (host, device) 10 * ({beneath} * 0 + 1 or on (host, device) {nomerges} * 0)",
                f"max by (host, device) (blockstack_queue_max_sectors_bytes{{{BS}}}) {kb}",
                f"max by (host, device) (blockstack_queue_max_hw_sectors_bytes{{{BS}}}) {kb}",
                f"max by (host, device, scheduler) (blockstack_queue_scheduler_info{{{BS}}} == 1)",
                f"max by (host, device) (blockstack_queue_rotational{{{BS}}})",
            ],
        )
    ]
    p = (
        table.Panel()
        .title("The stack at a glance: layers from top to physical disk")
        .datasource(DS)
        .span(24)
        .height(7)
        .description(
            "One row per layer of the selected stack, top (depth 0) first, down to the physical disk. name is the "
            "dm name (LVM VG-LV[-layer]) for device-mapper devices. Cells take the colour of the finding the setting "
            "makes (the Findings table): orange (warning) for nomerges beneath a stack, blue (info) for nomerges on "
            "a device nothing is stacked on or a max_sectors_kb below 128; red is for pages only. Healthy: "
            "nomerges 0 on every layer and max_sectors_kb >= 128 (the NVMe incident's "
            "healthy reads went down as 512-sector = 256 KiB requests). Sick: nomerges 2 on a lower layer (Ubuntu 4.4 "
            "set QUEUE_FLAG_NOMERGES on nvme1n1; the fix was `echo 0 > /sys/block/nvme1n1/queue/nomerges`), or a "
            "tiny max_sectors_kb (4 KiB splits every request into single pages). rotational 1 means a spinning "
            "disk, where a snapshot's COW syncs cost seeks (LVM2 write-up: writes 20-30x slower)."
        )
    )
    for t in targets:
        p = p.with_target(t)
    p = (
        p.no_value(
            "No device: this stack has no layer blockstack-exporter knows (pick a stack above)"
        )
        .with_transformation(merge())
        .with_transformation(
            organize(
                exclude=["Time", "host", "Value #A", "Value #E"],
                rename={
                    "Value #B": "nomerges",
                    "Value #C": "max_sectors_kb",
                    "Value #D": "max_hw_sectors_kb",
                    "Value #F": "rotational",
                    "vg_name": "LVM VG",
                    "lv_name": "LVM LV",
                    "lv_layer": "LVM layer",
                },
                order=[
                    "depth",
                    "device",
                    "name",
                    "kind",
                    "LVM VG",
                    "LVM LV",
                    "LVM layer",
                    "nomerges",
                    "max_sectors_kb",
                    "max_hw_sectors_kb",
                    "scheduler",
                    "rotational",
                ],
            )
        )
        .with_transformation(sort_by("depth"))
        .override_by_name(
            "nomerges",
            [
                prop(
                    "mappings",
                    [
                        m.to_json()
                        for m in value_map(
                            {
                                beneath + n: (
                                    text,
                                    HEALTHY if n == 0 else WARNING if beneath else INFO,
                                )
                                for beneath in (0, 10)
                                for n, text in (
                                    (0, "0 · all merges"),
                                    (1, "1 · simple only"),
                                    (2, "2 · no merges"),
                                )
                            }
                        )
                    ],
                ),
                color_cells(),
            ],
        )
        # info below the floor of max_sectors_low and BlockStackMaxSectorsLow (both also need it below
        # max_sectors_max_ratio x max_hw_sectors_kb, the column beside it: true of every hardware limit
        # from 512 KiB up)
        .override_by_name(
            "max_sectors_kb",
            [
                prop(
                    "thresholds",
                    {
                        "mode": "absolute",
                        "steps": [
                            {"value": None, "color": INFO},
                            {"value": k["max_sectors_floor_bytes"] // 1024, "color": HEALTHY},
                        ],
                    },
                ),
                color_cells(),
            ],
        )
        .override_by_name(
            "rotational",
            [
                prop(
                    "mappings",
                    [
                        m.to_json()
                        for m in value_map(
                            {0: ("0 · non-rotational", "text"), 1: ("1 · spinning", "text")}
                        )
                    ],
                )
            ],
        )
    )
    return [p]


def lineup_panels(k):
    size = ts(
        "Average request size per layer (upper vs lower)",
        "Average request size in 512-byte sectors per layer and operation (iostat avgrq-sz), from node_exporter "
        "diskstats, weighted by requests over each interval of the graph (a collapse's flood of small requests "
        "pulls it down at every range); L0 is the top of the stack, higher L numbers sit beneath it. Healthy: every "
        "layer of a sequential read carries about the same size (NVMe incident, healthy: dm-3, dm-1 and nvme1n1 all "
        "at 512.00; the lab's loop devices: ~256). Sick: the top stays large while a lower layer drops to 8 sectors "
        "(one 4 KiB page) - the incident: dm-3 at 512 over dm-1 and nvme1n1 at 8.00, 3000 r/s for 12 MB/s, %util "
        f"100. The dashed line is the collapse threshold ({k['collapse_max_sectors']} sectors); red marks are "
        "collapse pages.",
        [
            q(
                per_layer(
                    f"{weighted('host_device_operation:node_disk_bytes:rate', 'host_device_operation:node_disk_completed:rate')}"
                    " / 512"
                ),
                legend=LAYER_LEGEND,
            )
        ],
        "suffix: sectors",
        min=1,
        log=2,
        thresholds=steps((None, "transparent"), (k["collapse_max_sectors"], "red")),
    )
    iops = ts(
        "IOPS per layer",
        "Requests completed per second per layer and operation (iostat r/s, w/s), averaged over each interval of the "
        "graph. Healthy: a lower layer completes about as many requests as the layer above it (NVMe incident, "
        "healthy: 409.6 r/s on every layer for 104857 kB/s). Sick: the lower layer's IOPS explode while throughput "
        "falls (3000 r/s on nvme1n1 for 12000 kB/s).",
        [
            q(
                per_layer(
                    f"avg_over_time(host_device_operation:node_disk_completed:rate{{{SEL}}}{INTERVAL})"
                ),
                legend=LAYER_LEGEND,
            )
        ],
        "iops",
        min=0,
    )
    tput = ts(
        "Throughput per layer",
        "Bytes per second per layer and operation (iostat rkB/s, wkB/s), averaged over each interval of the graph. "
        "Healthy: the same bytes flow through each layer (104857 kB/s on nvme1n1, dm-1 and dm-0 in the NVMe "
        "incident). Sick: throughput drops by an order of magnitude on every layer at once while IOPS rise "
        "(12000 kB/s, 27x slower reads).",
        [
            q(
                per_layer(
                    f"avg_over_time(host_device_operation:node_disk_bytes:rate{{{SEL}}}{INTERVAL})"
                ),
                legend=LAYER_LEGEND,
            )
        ],
        "Bps",
        min=0,
    )
    merged, completed = (
        "host_device_operation:node_disk_merged:rate",
        "host_device_operation:node_disk_completed:rate",
    )
    ratio = ts(
        "Merge ratio per layer",
        "Share of submitted I/Os merged into another request: merged / (merged + completed) over each interval of "
        "the graph, iostat %rrqm / 100. Healthy: close to 1 on a layer that receives a sequential stream of small "
        "bios (64 4-KiB bios merged into one 256 KiB request = 0.98). Sick: 0 on the layer that should merge "
        "(nomerges=2: btrace shows no M events, every 8-sector request is issued on its own).",
        [
            q(
                per_layer(f"{over(merged)}\n  / (({over(merged)} + {over(completed)}) > 0)"),
                legend=LAYER_LEGEND,
            )
        ],
        "percentunit",
        min=0,
        max=1,
    )
    refused = layer_rate(
        "Refused merges per layer, peak per interval",
        "New requests made for a bio contiguous with a request of the same device and operation still waiting in the "
        "queue, where a merge would have fitted (ebpf_exporter, ebpf_exporter_block_rq_missed_merges_total): the merges "
        f"the layer refused. Each point is the highest {k['rate_window']} rate within its interval of the graph, so a collapse of a "
        "minute shows at its height over 24 h too. Layers with I/O only. Healthy: ~0 (sequential I/O is merged before "
        "issue; random I/O is never adjacent). Sick: about equal to the layer's IOPS - nomerges=2 refuses every merge "
        f"(the NVMe incident's 3000 8-sector r/s on nvme1n1). The dashed line is the page's floor "
        f"({k['missed_merges_min_rate']}/s).",
        "host_device_operation:ebpf_block_rq_missed_merges:rate",
        k["missed_merges_min_rate"],
    )
    splits = layer_rate(
        "Splits per layer, peak per interval",
        "Pieces split off bios to fit the layer's limits (max_sectors_kb, segments; ebpf_exporter, "
        f"ebpf_exporter_block_bio_splits_total): each is an extra request. Each point is the highest {k['rate_window']} rate within "
        "its interval of the graph. Layers with I/O only. Healthy: 0 when bios fit, or a few large pieces (a 1 MiB "
        "write cut at 128 KiB); a dm snapshot splits every bio into chunks (51,200 splits per 200 MiB at 4 KiB "
        "chunks, merged back beneath when nomerges=0). Sick: about the layer's IOPS in tiny pieces "
        f"(max_sectors_kb=4: 127 of every 128 requests). The dashed line is the page's floor ({k['split_min_rate']}/s).",
        "host_device_operation:ebpf_block_bio_splits:rate",
        k["split_min_rate"],
    )
    return [layer_colours(p) for p in (size, refused, splits, iops, tput, ratio)]


# The interval of the graph that starts at each point (the step, from the point on): each sample falls in
# one. Grafana aligns a range's end down to a multiple of the step, so a window ending at each point
# never reaches the latest, partial interval (at 24 h the last 2 minutes: a collapse under way would not
# show); a point shows its interval, drawn at its start.
INTERVAL = "[$__interval] offset -$__interval"


def over(record):
    """sum_over_time of a recorded rate over each interval of the graph (weighted())."""
    return f"sum_over_time({record}{{{SEL}}}{INTERVAL})"


def weighted(numerator, denominator):
    """numerator / denominator of two recorded rates over each whole interval of the graph: an average
    weighted by the denominator's events. The rules' 20 s windows sampled at the graph's step would show
    one window per step and miss what happens between (over 24 h, at a 2-minute step, one in 6)."""
    return f"{over(numerator)}\n  / ({over(denominator)} > 0)"


def peak(record):
    """A recorded rate's highest value within each interval of the graph (INTERVAL): the peak per
    interval, at every range."""
    return f"max_over_time({record}{{{SEL}}}{INTERVAL})"


def layer_rate(title, description, record, floor):
    """A lineup panel: the peak per interval of the recording rule `record` (events per second) per
    layer with I/O, and a dashed red line at the page's floor."""
    return ts(
        title,
        description,
        [q(per_layer(with_traffic(peak(record))), legend=LAYER_LEGEND)],
        "reqps",
        min=0,
        thresholds=steps((None, "transparent"), (floor, "red")),
    )


LAYER_LEGEND = "L{{depth}} {{name}} {{operation}}"


def per_layer(expr):
    """expr's series with the layer's depth below the top and its name (legend LAYER_LEGEND)."""
    return f"{expr}\n  * on (host, device) group_left (depth, name)\n{LAYERS}"


def with_traffic(expr):
    """expr for the devices and operations that issued requests (ebpf_exporter, block_rq_issue) in the
    interval, 0 where it has no series (an ebpf_exporter counter appears only once it counts), and
    wherever expr is above 0: a bio-based device (dm, md) issues no requests of its own, yet splits bios
    (a dm snapshot every one)."""
    issued = peak("host_device_operation:ebpf_block_rq:rate")
    return f"(\n  ({expr} or {issued} * 0)\n    and on (host, device, operation) ({issued} > 0)\n  or {expr} > 0\n)"


def ebpf_rate(k, metric, extra="", window="$__rate_interval"):
    """rate() of an ebpf_exporter series, named: its series carry the device number (devno), and
    the rules' device map (host_devno:blockstack_device:info) gives the device's name now."""
    return (
        f'rate({metric}{{{k["ebpf_selector"]}, host="$host"{extra}}}[{window}])'
        f" * on (host, devno) group_left (device) host_devno:blockstack_device:info{{{SEL}}}"
    )


def peak_quantile(q, buckets, name, window, config=BLOCK_IO):
    """in_range(q, buckets) at its highest within each interval of the graph, so that a p99 of a slow
    minute keeps its height over 24 h (a rate over the whole interval would dilute it): a subquery
    of the rates in `buckets` over `window`, stepped by `window` (back to back, every request in one
    of them). The step is explicit: a subquery's default is the server's evaluation interval (Thanos
    Query: 1m), sparser than an interval of the graph. Its panel's minimum interval is `window`
    (ts(interval=)), so every interval holds a step."""
    return f"max_over_time({in_range(q, buckets, name, config)}[$__interval:{window}] offset -$__interval)"


def distribution_panels(k):
    def buckets(metric, extra=""):
        return q(
            observed(ebpf_rate(k, metric + "_bucket", extra)),
            legend="{{le}}",
            fmt=pm.PromQueryFormat.HEATMAP,
        )

    bio = heat(
        "Bio size at submission - $device",
        "Sizes of the bios submitted to this device (block_bio_queue), before merging and splitting: what the layer "
        "above asked for. Healthy: on the top device, the application's I/O size (4 KiB for the incident's page-cache "
        "reads and the lab's fio); on a lower device, the requests of the layer above (128 KiB in the lab). Sick: the "
        "same picture as healthy when the collapse happens in this device's queue (compare with the request sizes at "
        "driver issue); 4 KiB bios on a lower device mean a layer above split them (a snapshot's 4 KiB chunks).",
        buckets("ebpf_exporter_block_bio_size_bytes"),
        "bytes",
    )
    rq = heat(
        "Request size at driver issue - $device",
        "Sizes of the requests this device issues to its driver (block_rq_issue), after merging and splitting. "
        "Healthy: the mass sits at 128-512 KiB for sequential I/O (bios merged up to max_sectors_kb). Sick: the mass "
        "drops to the 4 KiB row (8 sectors, nomerges=2 or max_sectors_kb=4) - the NVMe incident's 8-sector requests.",
        buckets("ebpf_exporter_block_rq_size_bytes"),
        "bytes",
    )
    lat = heat(
        "Service latency (issue to complete) - $device",
        "Time from driver issue to completion per request (block_rq_issue -> block_rq_complete). Healthy: a tight "
        "band (NVMe incident, healthy: 0.36-5.9 ms per 512-sector request). Sick: more, slower requests as the queue "
        "saturates (snapshot case: up to 24.8 ms, 98% of requests slower, 64x as many requests: 131194 vs 2049).",
        buckets("ebpf_exporter_block_rq_latency_seconds", ', stage="service"'),
        "s",
    )

    def quantile(q, stage):
        rate = ebpf_rate(
            k,
            "ebpf_exporter_block_rq_latency_seconds_bucket",
            f', stage="{stage}"',
            k["rate_window"],
        )
        return per_layer(
            peak_quantile(
                q,
                f"sum by (host, device, le) ({rate})",
                "block_rq_latency_seconds",
                k["rate_window"],
            )
        )

    pcts = ts(
        "Latency p50 / p99 per layer, peak per interval",
        "Per layer with requests (reads and writes together): p50 and p99 of service time (issue to complete) and p99 "
        f"of queue time (request made to issue; devices with an I/O scheduler only), over {k['rate_window']} windows "
        "as the rules, each point the highest within its interval of the graph. A quantile is drawn only where "
        "it falls inside the histogram's range: one in the top bucket (all waits longer than its lower bound, "
        f"{histogram_top(BLOCK_IO, 'block_rq_latency_seconds'):g} s) has no value to draw. Healthy: p99 within a few "
        "ms on SSD/NVMe (NVMe incident, healthy max 5.9 ms). Sick: p99 climbs with the queue full of small requests "
        "(24.8 ms in the snapshot case; await 10 ms at avgqu-sz 30).",
        [
            q(quantile(0.5, "service"), legend="p50 service L{{depth}} {{name}}", ref="A"),
            q(quantile(0.99, "service"), legend="p99 service L{{depth}} {{name}}", ref="B"),
            q(quantile(0.99, "queue"), legend="p99 queue L{{depth}} {{name}}", ref="C"),
        ],
        "s",
        w=24,
        h=10,
        log=10,
        interval=k["rate_window"],
    )
    # a layer's colour, p50 dotted and the queue's p99 dashed
    pcts = (
        layer_colours(pcts)
        .override_by_regexp("^p50 .*", [prop("custom.lineStyle", {"fill": "dot", "dash": [0, 10]})])
        .override_by_regexp(
            "^p99 queue .*", [prop("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})]
        )
    )
    return [bio, rq, lat, pcts]


def observed(rate):
    """sum by (le) of a histogram's bucket rates, at the times some observation was made: an idle
    range is then empty, and the heatmap says so (heat())."""
    total = rate.replace("_bucket{", '_bucket{le="+Inf", ', 1)
    return f"sum by (le) ({rate})\n  and on () (sum({total}) > 0)"


def snapshot_panels(k):
    sel = f"{k['blockstack_selector']}, {SEL}"
    use = ts(
        "Snapshot COW use",
        "Share of each dm-snapshot's COW store in use (dmsetup status used/total). Healthy: well below 100% with room "
        "for the writes until the snapshot is removed. Sick: approaching 100% - a full COW store invalidates the "
        "snapshot (state invalid/overflow). Every first write to a chunk of the origin costs a COW copy that must be "
        "synced first (LVM2 write-up: writes 20-30x slower with a snapshot).",
        [q(f"host_device:blockstack_dm_snapshot_cow_used:ratio{{{SEL}}}", legend="{{name}}")],
        "percentunit",
        min=0,
        max=1,
        thresholds=steps(
            (None, "transparent"),
            (k["snapshot_fill_min_used_ratio"], INFO),
            (k["snapshot_cow_used_warning_ratio"], WARNING),
        ),
        no_value=NO_SNAPSHOT,
    )
    cow_bytes = ts(
        "Snapshot COW bytes used / size",
        "Bytes of the COW device in use (data and metadata) against its size. Healthy: used grows only with writes "
        "to chunks not yet copied, far below size (the NVMe incident's snapshot was given 90% of the free extents). "
        "Sick: used reaches size and the snapshot turns invalid; in the LVM2 write-up a 1 GB write with 4 KiB "
        "chunks took 625 s against 55 s with 512 KiB chunks.",
        [
            q(f"blockstack_dm_snapshot_cow_used_bytes{{{sel}}}", legend="used {{name}}", ref="A"),
            q(f"blockstack_dm_snapshot_cow_size_bytes{{{sel}}}", legend="size {{name}}", ref="B"),
        ],
        "bytes",
        min=0,
        no_value=NO_SNAPSHOT,
    )
    w = k["snapshot_fill_window"]
    ttf = ts(
        "Snapshot time until COW full",
        f"Free COW bytes divided by the fill rate over the last {w} (deriv). Absent while the COW store is not "
        "growing. Healthy: days, or absent. Sick: hours - grow the COW LV (lvextend) or drop the snapshot before it "
        "becomes invalid.",
        [
            q(
                f"(blockstack_dm_snapshot_cow_size_bytes{{{sel}}} - blockstack_dm_snapshot_cow_used_bytes{{{sel}}})\n"
                f"  / (deriv(blockstack_dm_snapshot_cow_used_bytes{{{sel}}}[{w}]) > 0)",
                legend="{{name}}",
            )
        ],
        "s",
        min=0,
        no_value=f"{NO_SNAPSHOT}, or none filling",
    )
    chunk = stat_panel(
        "Snapshot chunk size",
        "The unit a snapshot copies on first write and the size of the requests it sends down. Healthy for write "
        "throughput: large chunks (LVM2 write-up, 1 GB dd with a snapshot: 512 KiB chunks 55 s). Sick: 4 KiB chunks "
        "(625 s for the same write) - every first write costs a small, synced COW copy, and reads of the snapshot "
        "reach the disks as chunk-sized requests.",
        [q(f"blockstack_dm_snapshot_chunk_size_bytes{{{sel}}}", legend="{{name}}")],
        "bytes",
        w=12,
        h=5,
        thresholds=steps((None, INFO), (k["snapshot_chunk_min_bytes"], HEALTHY)),
    )
    # no snapshot is no finding: its empty state neutral (the thresholds' base colour would paint it)
    chunk = chunk.no_value(NO_SNAPSHOT).mappings(
        [
            dm.SpecialValueMap(
                dm.DashboardSpecialValueMapOptions(
                    match=dm.SpecialValueMatch.NULL_AND_NAN,
                    result=dm.ValueMappingResult(text=NO_SNAPSHOT, color="transparent", index=0),
                )
            )
        ]
    )
    state = (
        table.Panel()
        .title("Snapshot state")
        .datasource(DS)
        .span(12)
        .height(5)
        .description(
            "Current state of each snapshot: valid, merging (snapshot-merge running), or invalid / overflow / "
            "merge_failed. Healthy: valid or merging. Sick: invalid or overflow - the COW store filled up (100% "
            "in the COW use panel) and the snapshot is lost; merge_failed needs lvconvert --merge to be retried."
        )
        .with_target(
            table_q(
                f"max by (host, device, name, state) (blockstack_dm_snapshot_state{{{sel}}} == 1)"
            )
        )
        .with_transformation(
            organize(exclude=["Time", "Value", "host"], order=["device", "name", "state"])
        )
        .override_by_name(
            "state",
            [
                prop(
                    "mappings",
                    [
                        m.to_json()
                        for m in value_map(
                            {
                                "valid": ("valid", HEALTHY),
                                "merging": ("merging", HEALTHY),
                                "invalid": ("invalid", "red"),
                                "overflow": ("overflow", "red"),
                                "merge_failed": ("merge_failed", WARNING),
                            }
                        )
                    ],
                ),
                color_cells(),
            ],
        )
        .no_value(NO_SNAPSHOT)
    )
    return [use, cow_bytes, ttf, chunk, state]


NO_SNAPSHOT = "No dm snapshot on this stack"
# The mount options of the ext4 incident, first in the options table in this order: dioread_nolock
# (made the default) or its fix dioread_lock, delalloc or its fix nodelalloc, then the journal's data
# mode and commit interval, which decide how often it fills.
EXT4_INCIDENT_OPTIONS = [
    ["dioread_nolock", "dioread_lock"],
    ["delalloc", "nodelalloc"],
    ["data", "commit"],
]


def ext4_option_ranks():
    """[(rank, options)] of EXT4_INCIDENT_OPTIONS, the first group highest; every other option is 1."""
    return [
        (len(EXT4_INCIDENT_OPTIONS) + 1 - i, group) for i, group in enumerate(EXT4_INCIDENT_OPTIONS)
    ]


def ext4_panels(k):
    sel = f"{k['blockstack_selector']}, {SEL}"
    # the incident's options first, marked: the query ranks them (EXT4_INCIDENT_OPTIONS), every other
    # option 1, and the table sorts by the rank
    by = "max by (host, device, mountpoint, option, value)"
    ranked = [
        f'{by} (blockstack_ext4_option_info{{{sel}, option=~"{"|".join(group)}"}}) * {rank}'
        for rank, group in ext4_option_ranks()
    ]
    rank_query = "\n  or ".join(ranked + [f"{by} (blockstack_ext4_option_info{{{sel}}})"])
    options = (
        table.Panel()
        .title("ext4 effective mount options")
        .datasource(DS)
        .span(12)
        .height(9)
        .description(
            "Every option in effect per ext4 filesystem of the stack, from /proc/fs/ext4/DEV/options (defaults "
            "included - /proc/mounts hides them, and the ext4 incident hid behind a default). The options of the "
            f"ext4 incident come first, marked ({', '.join(sum(EXT4_INCIDENT_OPTIONS, []))}; the journal's size is the "
            "panel beside); dioread_nolock is highlighted: the default since Linux 5.6 (commit 244adf6426). "
            "Healthy: dioread_lock, or dioread_nolock with a journal large enough for the writers (credit waits "
            "below 1 ms). Sick: with dioread_nolock, fsync-heavy random buffered writes fell from 20,026 to 315 "
            "IOPS on a 128 MiB journal; the fixes were dioread_lock, nodelalloc (disables dioread_nolock) or a "
            "1 GiB journal."
        )
        .with_target(table_q(rank_query))
        .with_transformation(
            organize(
                exclude=["Time", "host"],
                rename={"Value": "ext4 incident"},
                order=["Value", "option", "value", "device", "mountpoint"],
            )
        )
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="sortBy",
                options={"fields": {}, "sort": [{"field": "ext4 incident", "desc": True}]},
            )
        )
        .no_value("No ext4 filesystem on this stack")
        # a value-less option's cell empty, not the panel's empty state
        .override_by_name("value", [prop("noValue", "")])
        .override_by_name(
            "ext4 incident",
            [
                prop(
                    "mappings",
                    [
                        {
                            "type": "range",
                            "options": {
                                "from": 2,
                                "to": 1000,
                                "result": {"text": "yes", "index": 0},
                            },
                        },
                        {"type": "value", "options": {"1": {"text": "", "index": 1}}},
                    ],
                ),
                prop("custom.width", 110),
            ],
        )
        .override_by_name(
            "option",
            [
                prop(
                    "mappings",
                    [
                        m.to_json()
                        for m in value_map(
                            {
                                "dioread_nolock": ("dioread_nolock", INFO),
                                "dioread_lock": ("dioread_lock", "green"),
                                "nodelalloc": ("nodelalloc", "green"),
                            }
                        )
                    ],
                ),
                color_cells(),
                # the other options uncoloured (the cells would take the default thresholds' green)
                prop(
                    "thresholds",
                    {"mode": "absolute", "steps": [{"value": None, "color": "transparent"}]},
                ),
            ],
        )
    )
    journal = stat_panel(
        "ext4 journal size",
        "Size of each ext4 filesystem's internal journal. Healthy under fsync-heavy writers: large enough that handles "
        "rarely wait for credits (the ext4 incident was fixed by growing the journal from 128 MiB to 1 GiB). Sick: a "
        "small journal with dioread_nolock and long credit waits below.",
        [q(f"blockstack_ext4_journal_size_bytes{{{sel}}}", legend="{{device}} {{mountpoint}}")],
        "bytes",
        w=12,
        h=9,
        thresholds=steps((None, INFO), (k["ext4_journal_good_bytes"], HEALTHY)),
        no_value="No ext4 filesystem on this stack",
    )
    wait = heat(
        "jbd2 credit wait",
        "Time tasks wait for journal credits when starting a handle (add_transaction_credits), all ext4 filesystems "
        "of the stack. Healthy: the mass below 10 us (ext4 incident with dioread_lock: average 0.27 ms, mode "
        "0.5-4 us). Sick: a second mode at 8 ms - 1 s (with dioread_nolock: average 154 ms, waits up to 4 s).",
        q(
            observed(ebpf_rate(k, "ebpf_exporter_jbd2_credit_wait_seconds_bucket")),
            legend="{{le}}",
            fmt=pm.PromQueryFormat.HEATMAP,
        ),
        "s",
        w=12,
        h=9,
        repeat=False,
        cell_unit="ops",
    )
    jbd2_rate = ebpf_rate(
        k, "ebpf_exporter_jbd2_credit_wait_seconds_bucket", window=k["jbd2_rate_window"]
    )
    wait_p99 = ts(
        "jbd2 credit wait p99 / average, peak per interval",
        f"p99 (drawn only below the histogram's top bucket) and average credit wait per filesystem device over "
        f"{k['jbd2_rate_window']} windows, as the rules, each point the highest within its interval of the graph. "
        "Healthy: average well under 1 ms (0.27 ms in the ext4 incident with dioread_lock). Sick: average ~154 ms (the "
        "incident with dioread_nolock and a 128 MiB journal); p99 of hundreds of ms to seconds.",
        [
            q(
                peak_quantile(
                    0.99,
                    f"sum by (host, device, le) ({jbd2_rate})",
                    "jbd2_credit_wait_seconds",
                    k["jbd2_rate_window"],
                    JBD2,
                ),
                legend="p99 {{device}}",
                ref="A",
            ),
            q(
                peak("host_device:ebpf_jbd2_credit_wait_seconds:avg"),
                legend="average {{device}}",
                ref="B",
            ),
        ],
        "s",
        log=10,
        interval=k["jbd2_rate_window"],
    )
    tx = ts(
        "jbd2 transactions per second",
        "Journal transactions committed per second, and how many of them were requested (fsync and friends) rather "
        "than timer-driven (every commit= seconds, 5 by default). Healthy: under an fsync-heavy load, hundreds of "
        "small requested transactions per second (the lab's 4 fsync writers: ~300/s). Sick: few transactions with "
        "long credit waits - the journal is full and handles wait for a commit to free it (20,026 -> 315 IOPS in "
        "the ext4 incident).",
        [
            q(
                f"rate(blockstack_jbd2_transactions_total{{{sel}}}[$__rate_interval])",
                legend="committed {{journal}}",
                ref="A",
            ),
            q(
                f"rate(blockstack_jbd2_transactions_requested_total{{{sel}}}[$__rate_interval])",
                legend="requested {{journal}}",
                ref="B",
            ),
        ],
        "ops",
        min=0,
    )
    phases = ts(
        "jbd2 transaction phases (average since mount)",
        "Average time a transaction spends in each phase since mount (/proc/fs/jbd2/DEV/info), and the average commit "
        "time. Healthy: waiting, request_delay and locked near 0 ms. Sick: large 'waiting for transaction' and "
        "'transaction was being locked' - handles queue behind a commit (the ext4 incident's hung-task traces sit in "
        "wait_transaction_locked).",
        [
            q(
                f"blockstack_jbd2_transaction_phase_average_seconds{{{sel}}}",
                legend="{{phase}} {{journal}}",
                ref="A",
            ),
            q(
                f"blockstack_jbd2_commit_average_seconds{{{sel}}}",
                legend="commit {{journal}}",
                ref="B",
            ),
        ],
        "s",
        h=12,
        min=0,
    )
    return [options, journal, wait, wait_p99, tx, phases]


# --- Variables and annotations ---------------------------------------------------------------------


def variables():
    ds = (
        db.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        # value: the import input, replaced by the uid chosen on import (see INPUTS) and, in the
        # provisioned copy, by the provisioned datasource's (blockstack_deploy/grafana.py); left as
        # is, it matches no datasource and Grafana would query its default one
        .current(
            dm.VariableOption(
                selected=True, text=CONFIG["datasource_name"], value="${DS_PROMETHEUS}"
            )
        )
    )

    def query_variable(name, label, query, description):
        """Re-queried when the time range changes, options sorted."""
        return (
            db.QueryVariable(name)
            .label(label)
            .datasource(DS)
            .query({"query": query, "refId": name})
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .description(description)
        )

    host = query_variable(
        "host",
        "Host",
        "label_values(blockstack_device_info, host)",
        "The `host` label every scrape target carries.",
    )
    stack = query_variable(
        "stack",
        "Stack (top device)",
        one_line(STACK_QUERY),
        "A device with nothing above it (blockstack_device_holders == 0), by its dm/LVM name (the kernel name "
        "for other devices). Unattached loop devices are left out.",
    ).regex('/name="([^"]+)"/')
    device = (
        query_variable(
            "device",
            "Device (layer)",
            one_line(DEVICE_QUERY),
            "The kernel names of the stack's layers: the top and everything beneath it.",
        )
        .regex('/device="([^"]+)"/')
        .multi(True)
        .include_all(True)
        .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
    )
    return [ds, host, stack, device]


def one_line(query):
    """A variable query on one line. Grafana's Prometheus datasource recognises query_result(...) and
    label_values(...) with regexes whose `.` stops at a newline; a multi-line query falls through to
    /api/v1/series as a series matcher, which Prometheus refuses (HTTP 400), and the variable is empty."""
    return " ".join(query.split())


def collapse_annotation(panel_ids):
    expr = (
        f'ALERTS{{alertname=~"{CONFIG["collapse_alerts"]}", alertstate="firing", host="$host", '
        f'device=~"$device"}}'
    )
    a = (
        db.AnnotationQuery()
        .name("Merge collapse pages")
        .datasource(DS)
        .enable(True)
        .icon_color("red")
        .filter(db.AnnotationPanelFilter().exclude(False).ids(panel_ids))
        .expr(expr)
        .build()
    )
    # Prometheus annotation options Grafana reads from the annotation object itself.
    extra = {
        "step": "15s",
        "titleFormat": "{{alertname}}",
        "textFormat": "{{device}} {{operation}} on {{host}}: merge collapse paged (the alert's "
        "annotations name the cause and the settings)",
        "tagKeys": "alertname,severity,device",
        "useValueForTime": False,
    }
    return a, extra


# The datasource input of an import (Dashboards > New > Import, or POST /api/dashboards/import), as
# dashboards shared on grafana.com declare it: Grafana asks for a Prometheus datasource and writes
# its uid wherever ${DS_PROMETHEUS} stands. File provisioning ignores both fields.
INPUTS = [
    {
        "name": "DS_PROMETHEUS",
        "label": "Prometheus",
        "type": "datasource",
        "pluginId": "prometheus",
        "pluginName": "Prometheus",
        "description": "The Prometheus that scrapes node_exporter, blockstack-exporter and ebpf_exporter "
        "and evaluates alerts/recording.rules.yml",
    }
]
REQUIRES = [
    {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "12.4.0"},
    {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
] + [
    {"type": "panel", "id": p, "name": name, "version": ""}
    for p, name in [
        ("heatmap", "Heatmap"),
        ("stat", "Stat"),
        ("table", "Table"),
        ("timeseries", "Time series"),
    ]
]


# --- Assembly --------------------------------------------------------------------------------------

ROWS = [
    ("Alert state", alert_panels),
    ("The stack at a glance", stack_table),
    (
        "The lineup: request sizes, refused merges, splits, IOPS, throughput and merges per layer",
        lineup_panels,
    ),
    ("Distributions: sizes at bio submission and driver issue, latency", distribution_panels),
    ("LVM snapshots", snapshot_panels),
    ("ext4 / jbd2", ext4_panels),
]
LINEUP_ROW = 2


def build(k=None):
    """The dashboard model with the knobs `k` (default: alerts/config.yml)."""
    k = knobs.load() if k is None else k
    d = (
        db.Dashboard(CONFIG["title"])
        .uid(CONFIG["uid"])
        .description(
            "Linux block-layer merge regressions across a device stack (dm/LVM, loop, md, partitions, "
            "disks). Generated by dashboards/blockstack_dashboard.py - do not edit the JSON."
        )
        # read-only: the JSON is generated (an edit could not be saved to a provisioned copy anyway)
        .tags(["blockstack", "block-layer", "generated"])
        .readonly()
        .time(CONFIG["time_from"], "now")
        .refresh(CONFIG["refresh"])
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .link(
            db.DashboardLink("Runbook")
            .type(dm.DashboardLinkType.LINK)
            .url(f"{k['docs_url']}/dashboard.md")
            .target_blank(True)
        )
    )
    next_id = 1
    lineup_ids = []
    for i, (title, make) in enumerate(ROWS):
        d = d.with_row(db.Row(title).id(next_id))
        next_id += 1
        for panel in make(k):
            panel = panel.id(next_id)
            if i == LINEUP_ROW:
                lineup_ids.append(next_id)
            next_id += 1
            d = d.with_panel(panel)
    for v in variables():
        d = d.with_variable(v)
    ann, extra = collapse_annotation(lineup_ids)
    model = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    ann_json = json.loads(json.dumps(ann, cls=JSONEncoder))
    ann_json.update(extra)
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    model["annotations"] = {"list": [builtin, ann_json]}
    # Grafana 10.0's schema; the SDK stamps an older one, which would make Grafana re-run migrations.
    model["schemaVersion"] = 38
    for v in model["templating"]["list"]:
        # The SDK gives every variable the same placeholder id and interval-variable fields; a saved
        # Grafana dashboard has neither (Grafana keys variables by name).
        for k in ("id", "auto", "auto_count", "auto_min"):
            v.pop(k, None)
    for p in model["panels"]:
        if p.get("repeat"):
            p["maxPerRow"] = 3
    model["__inputs"], model["__requires"] = INPUTS, REQUIRES
    return model


def render():
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the committed JSON differs from the generated one",
    )
    ap.add_argument(
        "--output", default=OUTPUT, help="where to write the JSON (default: %(default)s)"
    )
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        try:
            with open(args.output) as f:
                committed = f.read()
        except FileNotFoundError:
            committed = ""
        if committed != text:
            sys.stdout.writelines(
                difflib.unified_diff(
                    committed.splitlines(True), text.splitlines(True), args.output, "generated"
                )
            )
            print(f"{args.output} is stale: run `make generate`", file=sys.stderr)
            return 1
        return 0
    with open(args.output, "w") as f:
        f.write(text)
    print(f">> wrote {os.path.relpath(args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
