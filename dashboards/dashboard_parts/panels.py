"""The panels of the dashboard's rows, but the stack table (stack_table.py). Each description says
what healthy and sick look like, with the figures of the incidents: the LVM-snapshot-on-NVMe
incident, the ext4 dioread_nolock incident and the lvm2 snapshot write-up (docs/dashboard.md)."""

from grafana_foundation_sdk.builders import table
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from .common import DS, HEALTHY, INFO, SEL, SEVERITY_COLOURS, WARNING
from .queries import (
    BLOCK_IO,
    CGROUP_BYTES,
    CGROUP_EVENTS,
    INTERVAL,
    JBD2,
    LAYER_LEGEND,
    by_cgroup,
    cgroup_slots,
    ebpf_rate,
    histogram_top,
    observed,
    over,
    peak,
    peak_quantile,
    per_layer,
    weighted,
    with_traffic,
)
from .widgets import (
    color_cells,
    heat,
    layer_colours,
    mappings,
    organize,
    prop,
    q,
    sort_by,
    stat_panel,
    steps,
    table_q,
    ts,
)

# Pixels the alert name column keeps: 8 per character of the longest name
# (BlockStackPrometheusNotConnectedToAlertmanagers, 47) and the cell's padding.
ALERT_NAME_WIDTH = 400
NO_SNAPSHOT = "No dm snapshot on this stack"
# The mount options of the ext4 incident, first in the options table in this order:
# dioread_nolock (made the default) or its fix dioread_lock, delalloc or its fix nodelalloc, then
# the journal's data mode and commit interval, which decide how often it fills.
EXT4_INCIDENT_OPTIONS = [
    ["dioread_nolock", "dioread_lock"],
    ["delalloc", "nodelalloc"],
    ["data", "commit"],
]


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
            "Alerts firing now for this host: those about a device of the selected stack, and "
            "those about the host as a whole (an exporter down). Healthy: the table is empty. "
            "Sick: BlockStackMergeCollapse* means a layer of this stack is splitting or not "
            "merging requests (the NVMe incident: dm-3 at 512 sectors per request over nvme1n1 at "
            "8, 27x slower reads); its runbook link is in the alert's annotations. The lineup "
            "panels below carry a red annotation for each such page."
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
                mappings({s: (s, c) for s, c in SEVERITY_COLOURS.items()}),
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
            "The sets of BPF programs this host's kernel loads (ebpf-configs/select-configs.sh at "
            "the stack's start): block (block_io, or block_io_immediate before Linux 5.17) counts "
            "refused merges and split-off pieces, the evidence every merge-collapse page rests "
            "on; jbd2 times journal credit waits. Healthy: both loaded (Linux 5.10 to 5.16: "
            "block_io_immediate). Sick: 'not loaded', no variant loads on this kernel (before "
            "5.10, or no BTF): no collapse can page on this host (alert "
            "BlockStackCollapseEvidenceMissing); the loaders' errors are in "
            "blockstack_ebpf_variant_failed_info and STATE_DIR/ebpf-status.tsv."
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
                mappings({1: ("loaded", HEALTHY), 0: ("not loaded", WARNING)}),
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
            "Misconfigurations the exporter finds on the stack's devices now (the checks of "
            "blockstack-doctor: one row per device and check). Healthy: no finding. Sick: e.g. "
            "nomerges 2 beneath a stack (the NVMe incident: nvme1n1 with QUEUE_FLAG_NOMERGES, "
            "8-sector requests, 27x slower reads), a max_sectors_kb far below max_hw_sectors_kb, "
            "4 KiB snapshot chunks (LVM2 write-up: 625 s vs 55 s for 1 GB), or dioread_nolock "
            "with a small journal (ext4 incident: 20,026 -> 315 IOPS). `blockstack-doctor "
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
                mappings({s: (s, c) for s, c in SEVERITY_COLOURS.items()}),
                color_cells(),
            ],
        )
        .no_value("No finding: the checks found no misconfiguration on this stack.")
    )


def lineup_panels(k):
    size = ts(
        "Average request size per layer (upper vs lower)",
        "Average request size in 512-byte sectors per layer and operation (iostat avgrq-sz), from "
        "node_exporter diskstats, weighted by requests over each interval of the graph (a "
        "collapse's flood of small requests pulls it down at every range); L0 is the top of the "
        "stack, higher L numbers sit beneath it. Healthy: every layer of a sequential read "
        "carries about the same size (NVMe incident, healthy: dm-3, dm-1 and nvme1n1 all at "
        "512.00; the lab's loop devices: ~256). Sick: the top stays large while a lower layer "
        "drops to 8 sectors (one 4 KiB page) - the incident: dm-3 at 512 over dm-1 and nvme1n1 at "
        "8.00, 3000 r/s for 12 MB/s, %util 100. The dashed line is the collapse threshold "
        f"({k['collapse_max_sectors']} sectors); red marks are collapse pages.",
        [
            q(
                per_layer(
                    weighted(
                        "host_device_operation:node_disk_bytes:rate",
                        "host_device_operation:node_disk_completed:rate",
                    )
                    + " / 512"
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
        "Requests completed per second per layer and operation (iostat r/s, w/s), averaged over "
        "each interval of the graph. Healthy: a lower layer completes about as many requests as "
        "the layer above it (NVMe incident, healthy: 409.6 r/s on every layer for 104857 kB/s). "
        "Sick: the lower layer's IOPS explode while throughput falls (3000 r/s on nvme1n1 for "
        "12000 kB/s).",
        [
            q(
                per_layer(
                    "avg_over_time(host_device_operation:node_disk_completed:rate"
                    f"{{{SEL}}}{INTERVAL})"
                ),
                legend=LAYER_LEGEND,
            )
        ],
        "iops",
        min=0,
    )
    tput = ts(
        "Throughput per layer",
        "Bytes per second per layer and operation (iostat rkB/s, wkB/s), averaged over each "
        "interval of the graph. Healthy: the same bytes flow through each layer (104857 kB/s on "
        "nvme1n1, dm-1 and dm-0 in the NVMe incident). Sick: throughput drops by an order of "
        "magnitude on every layer at once while IOPS rise (12000 kB/s, 27x slower reads).",
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
        "Share of submitted I/Os merged into another request: merged / (merged + completed) over "
        "each interval of the graph, iostat %rrqm / 100. Healthy: close to 1 on a layer that "
        "receives a sequential stream of small bios (64 4-KiB bios merged into one 256 KiB "
        "request = 0.98). Sick: 0 on the layer that should merge (nomerges=2: btrace shows no M "
        "events, every 8-sector request is issued on its own).",
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
        "New requests made for a bio contiguous with a request of the same device and operation "
        "still waiting in the queue, where a merge would have fitted (ebpf_exporter, "
        "ebpf_exporter_block_rq_missed_merges_total): the merges the layer refused. Each point is "
        f"the highest {k['rate_window']} rate within its interval of the graph, so a collapse of a "
        "minute shows at its height over 24 h too. Layers with I/O only. Healthy: ~0 (sequential "
        "I/O is merged before issue; random I/O is never adjacent). Sick: about equal to the "
        "layer's IOPS - nomerges=2 refuses every merge (the NVMe incident's 3000 8-sector r/s on "
        f"nvme1n1). The dashed line is the page's floor ({k['missed_merges_min_rate']}/s).",
        "host_device_operation:ebpf_block_rq_missed_merges:rate",
        k["missed_merges_min_rate"],
    )
    splits = layer_rate(
        "Splits per layer, peak per interval",
        "Pieces split off bios to fit the layer's limits (max_sectors_kb, segments; "
        "ebpf_exporter, ebpf_exporter_block_bio_splits_total): each is an extra request. Each "
        f"point is the highest {k['rate_window']} rate within its interval of the graph. Layers "
        "with I/O only. Healthy: 0 when bios fit, or a few large pieces (a 1 MiB write cut at 128 "
        "KiB); a dm snapshot splits every bio into chunks (51,200 splits per 200 MiB at 4 KiB "
        "chunks, merged back beneath when nomerges=0). Sick: about the layer's IOPS in tiny "
        "pieces (max_sectors_kb=4: 127 of every 128 requests). The dashed line is the page's "
        f"floor ({k['split_min_rate']}/s).",
        "host_device_operation:ebpf_block_bio_splits:rate",
        k["split_min_rate"],
    )
    return [layer_colours(p) for p in (size, refused, splits, iops, tput, ratio)]


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


def distribution_panels(k):
    def buckets(metric, extra=""):
        return q(
            observed(ebpf_rate(k, metric + "_bucket", extra)),
            legend="{{le}}",
            fmt=pm.PromQueryFormat.HEATMAP,
        )

    bio = heat(
        "Bio size at submission - $device",
        "Sizes of the bios submitted to this device (block_bio_queue), before merging and "
        "splitting: what the layer above asked for. Healthy: on the top device, the application's "
        "I/O size (4 KiB for the incident's page-cache reads and the lab's fio); on a lower "
        "device, the requests of the layer above (128 KiB in the lab). Sick: the same picture as "
        "healthy when the collapse happens in this device's queue (compare with the request sizes "
        "at driver issue); 4 KiB bios on a lower device mean a layer above split them (a "
        "snapshot's 4 KiB chunks).",
        buckets("ebpf_exporter_block_bio_size_bytes"),
        "bytes",
    )
    rq = heat(
        "Request size at driver issue - $device",
        "Sizes of the requests this device issues to its driver (block_rq_issue), after merging "
        "and splitting. Healthy: the mass sits at 128-512 KiB for sequential I/O (bios merged up "
        "to max_sectors_kb). Sick: the mass drops to the 4 KiB row (8 sectors, nomerges=2 or "
        "max_sectors_kb=4) - the NVMe incident's 8-sector requests.",
        buckets("ebpf_exporter_block_rq_size_bytes"),
        "bytes",
    )
    lat = heat(
        "Service latency (issue to complete) - $device",
        "Time from driver issue to completion per request (block_rq_issue -> block_rq_complete). "
        "Healthy: a tight band (NVMe incident, healthy: 0.36-5.9 ms per 512-sector request). "
        "Sick: more, slower requests as the queue saturates (snapshot case: up to 24.8 ms, 98% of "
        "requests slower, 64x as many requests: 131194 vs 2049).",
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
        "Per layer with requests (reads and writes together): p50 and p99 of service time (issue "
        "to complete) and p99 of queue time (request made to issue; devices with an I/O scheduler "
        f"only), over {k['rate_window']} windows as the rules, each point the highest within its "
        "interval of the graph. A quantile is drawn only where it falls inside the histogram's "
        "range: one in the top bucket (all waits longer than its lower bound, "
        f"{histogram_top(BLOCK_IO, 'block_rq_latency_seconds'):g} s) has no value to draw. "
        "Healthy: p99 within a few ms on SSD/NVMe (NVMe incident, healthy max 5.9 ms). Sick: p99 "
        "climbs with the queue full of small requests (24.8 ms in the snapshot case; await 10 ms "
        "at avgqu-sz 30).",
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
    return [bio, rq, lat, pcts, whose_io_panel()]


def whose_io_panel():
    """Per device, its busiest block cgroups: bytes per second and refused merges plus split-off
    pieces per second (the recording rules host_device_operation_cgroup:ebpf_block_cgroup_*)."""
    return (
        ts(
            "Whose I/O - $device",
            "Whose I/O the device serves, by block cgroup: the cgroup the kernel charges each bio "
            "to (a service such as postgresql.service; a container's scope as \"docker "
            '0123456789ab"; ebpf_exporter, ebpf-configs/block_cgroups.bpf.h). Bytes per second '
            "submitted (solid, left axis) and refused merges plus pieces split off per second "
            "(dashed, right axis), reads and writes together, averaged over each interval of the "
            f"graph. {cgroup_slots()} cgroups by name, the same over the whole range: first those "
            "whose I/O was split or refused merging, then the busiest, each by bytes; all others "
            "summed as 'other'. Healthy: refused + split near 0 for every cgroup, whatever its bytes. Sick: "
            "in a collapse they follow the cgroups whose I/O is split or refused merging, as the "
            "page's 'Mostly from' names them (the loop lab at max_sectors_kb=4: the reader's "
            "cgroup has 100% of the pieces, about one split off per request issued).",
            [
                q(by_cgroup(CGROUP_BYTES), legend="bytes {{cgroup}}", ref="A"),
                # 0 for a cgroup with bytes and nothing refused or split (no series counted yet)
                q(
                    f"{by_cgroup(CGROUP_EVENTS)}\n  or {by_cgroup(CGROUP_BYTES)} * 0",
                    legend="refused + split {{cgroup}}",
                    ref="B",
                ),
            ],
            "Bps",
            h=12,  # a legend row for each of 2 x (5 cgroups and "other")
            min=0,
            no_value="No I/O counted by cgroup on this device in this range",
        )
        .repeat("device")
        .repeat_direction("h")
        .override_by_query(
            "B",
            [
                prop("unit", "reqps"),
                prop("custom.axisPlacement", "right"),
                prop("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
            ],
        )
    )


def snapshot_panels(k):
    sel = f"{k['blockstack_selector']}, {SEL}"
    use = ts(
        "Snapshot COW use",
        "Share of each dm-snapshot's COW store in use (dmsetup status used/total). Healthy: well "
        "below 100% with room for the writes until the snapshot is removed. Sick: approaching "
        "100% - a full COW store invalidates the snapshot (state invalid/overflow). Every first "
        "write to a chunk of the origin costs a COW copy that must be synced first (LVM2 "
        "write-up: writes 20-30x slower with a snapshot).",
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
        "Bytes of the COW device in use (data and metadata) against its size. Healthy: used grows "
        "only with writes to chunks not yet copied, far below size (the NVMe incident's snapshot "
        "was given 90% of the free extents). Sick: used reaches size and the snapshot turns "
        "invalid; in the LVM2 write-up a 1 GB write with 4 KiB chunks took 625 s against 55 s "
        "with 512 KiB chunks.",
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
        f"Free COW bytes divided by the fill rate over the last {w} (deriv). Absent while the COW "
        "store is not growing. Healthy: days, or absent. Sick: hours - grow the COW LV (lvextend) "
        "or drop the snapshot before it becomes invalid.",
        [
            q(
                f"(blockstack_dm_snapshot_cow_size_bytes{{{sel}}} - "
                f"blockstack_dm_snapshot_cow_used_bytes{{{sel}}})\n  / "
                f"(deriv(blockstack_dm_snapshot_cow_used_bytes{{{sel}}}[{w}]) > 0)",
                legend="{{name}}",
            )
        ],
        "s",
        min=0,
        no_value=f"{NO_SNAPSHOT}, or none filling",
    )
    chunk = stat_panel(
        "Snapshot chunk size",
        "The unit a snapshot copies on first write and the size of the requests it sends down. "
        "Healthy for write throughput: large chunks (LVM2 write-up, 1 GB dd with a snapshot: 512 "
        "KiB chunks 55 s). Sick: 4 KiB chunks (625 s for the same write) - every first write "
        "costs a small, synced COW copy, and reads of the snapshot reach the disks as chunk-sized "
        "requests.",
        [q(f"blockstack_dm_snapshot_chunk_size_bytes{{{sel}}}", legend="{{name}}")],
        "bytes",
        w=12,
        h=5,
        thresholds=steps((None, INFO), (k["snapshot_chunk_min_bytes"], HEALTHY)),
    )
    # no snapshot is no finding: its empty state neutral (the thresholds' base colour would
    # paint it)
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
            "Current state of each snapshot: valid, merging (snapshot-merge running), or invalid "
            "/ overflow / merge_failed. Healthy: valid or merging. Sick: invalid or overflow - "
            "the COW store filled up (100% in the COW use panel) and the snapshot is lost; "
            "merge_failed needs lvconvert --merge to be retried."
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
                mappings(
                    {
                        "valid": ("valid", HEALTHY),
                        "merging": ("merging", HEALTHY),
                        "invalid": ("invalid", "red"),
                        "overflow": ("overflow", "red"),
                        "merge_failed": ("merge_failed", WARNING),
                    }
                ),
                color_cells(),
            ],
        )
        .no_value(NO_SNAPSHOT)
    )
    return [use, cow_bytes, ttf, chunk, state]


def ext4_option_ranks():
    """[(rank, options)] of EXT4_INCIDENT_OPTIONS, the first group highest; every other option
    is 1."""
    return [
        (len(EXT4_INCIDENT_OPTIONS) + 1 - i, group) for i, group in enumerate(EXT4_INCIDENT_OPTIONS)
    ]


def ext4_panels(k):
    return [
        ext4_options_panel(k),
        ext4_journal_panel(k),
        jbd2_wait_panel(k),
        jbd2_wait_peak_panel(k),
        jbd2_journal_full_panel(k),
        jbd2_transactions_panel(k),
        jbd2_phases_panel(k),
    ]


def _stack_selector(k):
    return f"{k['blockstack_selector']}, {SEL}"


def ext4_options_panel(k):
    """Each ext4 filesystem's effective mount options, the incident's first."""
    return (
        table.Panel()
        .title("ext4 effective mount options")
        .datasource(DS)
        .span(12)
        .height(9)
        .description(
            "Every option in effect per ext4 filesystem of the stack, from "
            "/proc/fs/ext4/DEV/options (defaults included - /proc/mounts hides them, and the ext4 "
            "incident hid behind a default). The options of the ext4 incident come first, marked "
            f"({', '.join(sum(EXT4_INCIDENT_OPTIONS, []))}; the journal's size is the panel "
            "beside); dioread_nolock is highlighted: the default since Linux 5.6 (commit "
            "244adf6426). Healthy: dioread_lock, or dioread_nolock with a journal large enough "
            "for the writers (credit waits below 1 ms). Sick: with dioread_nolock, fsync-heavy "
            "random buffered writes fell from 20,026 to 315 IOPS on a 128 MiB journal; the fixes "
            "were dioread_lock, nodelalloc (disables dioread_nolock) or a 1 GiB journal."
        )
        .with_target(table_q(_ext4_options_query(k)))
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
        .override_by_name("ext4 incident", _ext4_incident_cells())
        .override_by_name("option", _ext4_option_cells())
    )


def _ext4_options_query(k):
    """The effective options, the incident's ranked above the others."""
    sel = _stack_selector(k)
    # the incident's options first, marked: the query ranks them (EXT4_INCIDENT_OPTIONS), every
    # other option 1, and the table sorts by the rank
    by = "max by (host, device, mountpoint, option, value)"
    ranked = [
        f'{by} (blockstack_ext4_option_info{{{sel}, option=~"{"|".join(group)}"}}) * {rank}'
        for rank, group in ext4_option_ranks()
    ]
    return "\n  or ".join(ranked + [f"{by} (blockstack_ext4_option_info{{{sel}}})"])


def _ext4_incident_cells():
    """The rank column: "yes" for an option of the ext4 incident, empty for the others."""
    return [
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
    ]


def _ext4_option_cells():
    """The option column: dioread_nolock blue, its fixes green, the others uncoloured."""
    return [
        mappings(
            {
                "dioread_nolock": ("dioread_nolock", INFO),
                "dioread_lock": ("dioread_lock", "green"),
                "nodelalloc": ("nodelalloc", "green"),
            }
        ),
        color_cells(),
        # the other options uncoloured (the cells would take the default thresholds' green)
        prop(
            "thresholds",
            {"mode": "absolute", "steps": [{"value": None, "color": "transparent"}]},
        ),
    ]


def ext4_journal_panel(k):
    """Each ext4 filesystem's journal size, blue below ext4_journal_good_bytes."""
    sel = _stack_selector(k)
    return stat_panel(
        "ext4 journal size",
        "Size of each ext4 filesystem's internal journal. Healthy under fsync-heavy writers: "
        "large enough that handles rarely wait for credits (the ext4 incident was fixed by "
        "growing the journal from 128 MiB to 1 GiB). Sick: a small journal with dioread_nolock "
        "and long credit waits below.",
        [q(f"blockstack_ext4_journal_size_bytes{{{sel}}}", legend="{{device}} {{mountpoint}}")],
        "bytes",
        w=12,
        h=9,
        thresholds=steps((None, INFO), (k["ext4_journal_good_bytes"], HEALTHY)),
        no_value="No ext4 filesystem on this stack",
    )


def jbd2_wait_panel(k):
    """The heatmap of jbd2 credit waits (ebpf_exporter)."""
    return heat(
        "jbd2 credit wait",
        "Time tasks wait for journal credits when starting a handle (add_transaction_credits), "
        "all ext4 filesystems of the stack. Healthy: the mass below 10 us (ext4 incident with "
        "dioread_lock: average 0.27 ms, mode 0.5-4 us). Sick: a second mode at 8 ms - 1 s (with "
        "dioread_nolock: average 154 ms, waits up to 4 s).",
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


def jbd2_wait_peak_panel(k):
    """jbd2 credit wait p99 and average, each point its interval's peak."""
    jbd2_rate = ebpf_rate(
        k, "ebpf_exporter_jbd2_credit_wait_seconds_bucket", window=k["jbd2_rate_window"]
    )
    return ts(
        "jbd2 credit wait p99 / average, peak per interval",
        "p99 (drawn only below the histogram's top bucket) and average credit wait per filesystem "
        f"device over {k['jbd2_rate_window']} windows, as the rules, each point the highest within "
        "its interval of the graph. Healthy: average well under 1 ms (0.27 ms in the ext4 "
        "incident with dioread_lock). Sick: average ~154 ms (the incident with dioread_nolock and "
        "a 128 MiB journal); p99 of hundreds of ms to seconds.",
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


def jbd2_journal_full_panel(k):
    """The share of handle starts that found the journal full, each point its interval's peak."""
    return ts(
        "jbd2 handle starts that found the journal full, peak per interval",
        "Share of the handle starts per filesystem device that found the journal full and had to "
        f"checkpoint it to make room (jbd2_log_do_checkpoint, eBPF), over {k['jbd2_rate_window']} "
        "windows as the rules, each point the highest within its interval of the graph. Healthy: "
        "none, or about 1 in 100,000 (a 1 GiB journal under 256 fsyncing writers: 0.001 %). Sick: "
        "percents - the journal is too small for its writers, who wait for checkpoints (the lab's "
        "4 MiB journal: 3-7 %; Debian 6.1 with dioread_nolock: 21 %). Long credit waits without "
        "it are CPU or device contention, not the journal's size.",
        [
            q(
                peak("host_device:ebpf_jbd2_checkpoint_waits:ratio"),
                legend="{{device}}",
                ref="A",
            ),
        ],
        "percentunit",
        min=0,
        no_value="No handle start found a journal full in this time range",
    )


def jbd2_transactions_panel(k):
    """jbd2 transactions committed and requested per second."""
    sel = _stack_selector(k)
    return ts(
        "jbd2 transactions per second",
        "Journal transactions committed per second, and how many of them were requested (fsync "
        "and friends) rather than timer-driven (every commit= seconds, 5 by default). Healthy: "
        "under an fsync-heavy load, hundreds of small requested transactions per second (the "
        "lab's 4 fsync writers: ~300/s). Sick: few transactions with long credit waits - the "
        "journal is full and handles wait for a commit to free it (20,026 -> 315 IOPS in the ext4 "
        "incident).",
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


def jbd2_phases_panel(k):
    """jbd2 transaction phases' averages since mount."""
    sel = _stack_selector(k)
    return ts(
        "jbd2 transaction phases (average since mount)",
        "Average time a transaction spends in each phase since mount (/proc/fs/jbd2/DEV/info), "
        "and the average commit time. Healthy: waiting, request_delay and locked near 0 ms. Sick: "
        "large 'waiting for transaction' and 'transaction was being locked' - handles queue "
        "behind a commit (the ext4 incident's hung-task traces sit in wait_transaction_locked).",
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
        w=24,
        h=12,
        min=0,
    )
