"""merge_collapse, the doctor's --interval row of the table of checks (checks.py), judged on the
interval's lineup (Host.lineup) as the collapse rules judge it."""

from . import checks
from .lineup import top_cgroups
from .settings import MAX_HW_SECTORS_KB, MAX_SECTORS_KB, NOMERGES, QUEUE

# The knobs of BlockStackMergeCollapse's evidence, which --interval's collapse finding reads
INTERVAL_KNOBS = (
    "max_sectors_floor_bytes",
    "collapse_max_sectors",
    "collapse_upper_min_sectors",
    "collapse_min_split_ratio",
    "collapse_min_iops",
    "collapse_min_upper_share",
    "missed_merges_min_rate",
    "missed_merges_min_ratio",
    "split_min_rate",
    "split_min_ratio",
)


def merge_collapse(host, k):
    """The check: collapse_findings on the doctor's interval (none without one)."""
    return collapse_findings(host, host.lineup or {}, k)


def collapse_findings(host, rows, k):
    """merge_collapse on the interval, judged as the rules judge it (alerts/src/recording.rules.yml.in):
    critical only on evidence counted on the device's own requests by ebpf_exporter (--ebpf), the
    evidence BlockStackMergeCollapse pages on: merging refused (blockstack_collapse_refused) or
    requests split into tiny pieces (blockstack_collapse_split). The layered shape (a device
    where requests reach a driver serves small requests while a device above it sends large
    ones carrying most of its bytes: blockstack_collapse_layered) is info, context as the
    dashboard shows it: another tenant's small I/O on a shared disk looks the same.
    Without eBPF, requests cut at a max_sectors_kb below the floor (diskstats: tiny requests at a
    real rate, each as large as the limit allows) are a warning: the split collapse the page names
    "split into tiny pieces", seen from diskstats alone (the doctor then exits 1, as it must while
    that page fires), though only eBPF can count the pieces."""
    out = []
    for dev in sorted(rows):
        if dev not in host.devices:
            continue
        for op, row in rows[dev].items():
            upper = _layered_upper(host, rows, dev, op, k)
            refused, split = _refused(row, k), _split(row, k)
            at_limit = _at_limit(host, row, dev, k)
            if upper or refused or split or at_limit:
                out.append(_finding(host, rows, dev, op, upper, refused, split, at_limit, k))
    return out


def _finding(host, rows, dev, op, upper, refused, split, at_limit, k):
    row = rows[dev][op]
    owner = host.queue_owner(dev)
    q = host.queue.get(owner, {})
    evidence = _evidence(host, rows, dev, op, upper)
    shown = (f"{s.file} {s.shown(q.get(s.file, 0))}" for s in QUEUE if s.collapse)
    evidence.append(f"/sys/block/{owner}/queue: {', '.join(shown)}")
    fix, spec = _collapse_fix(owner, q, k, split_first=(split or at_limit) and not refused)
    if refused or split:
        proves, severity = ("merging refused" if refused else "requests split"), "critical"
    elif at_limit:
        proves, severity = "requests split (diskstats)", "warning"
    else:
        proves, severity = "layered", "info"
    what = f"{proves}: {dev} {op}s {row['sectors']:.0f}-sector requests at {row['rps']:.0f}/s"
    whose = top_cgroups({c: r["collapse_ps"] for c, r in row.get("cgroups", {}).items()})
    if (refused or split) and whose:
        what += f", mostly from {whose}"
    if at_limit and not (refused or split):
        what += (
            f", each as large as max_sectors_kb={at_limit} allows: larger I/O is cut to that "
            "size (--ebpf counts the pieces)"
        )
    elif not (refused or split):
        what += (
            f" beneath {host.label(upper)}'s {rows[upper][op]['sectors']:.0f}-sector ones; no page "
            f"without refused merges or splits counted on {dev}'s own requests"
        )
    return checks.Finding(
        "merge_collapse",
        dev,
        severity,
        what,
        evidence,
        fix,
        "see the setting's own finding; docs/runbook.md#blockstackmergecollapse",
        checks.NVME_WRITEUP,
        spec=spec,
    )


def _evidence(host, rows, dev, op, upper):
    """The device's requests, the larger ones of the device above (layered), ebpf_exporter's."""
    row = rows[dev][op]
    evidence = [
        f"{dev}: {row['rps']:.0f} {op}s/s, {row['kbps']:.0f} kB/s, {row['merges_ps']:.0f} merges/s"
    ]
    if upper:
        up = rows[upper][op]
        evidence.append(
            f"{host.label(upper)} {op}s {up['sectors']:.0f}-sector requests "
            f"({up['rps']:.0f}/s, {up['kbps']:.0f} kB/s)"
        )
    if "issued_ps" in row:
        size = (
            f", {row['issued_sectors']:.0f} sectors each"
            if row["issued_sectors"] is not None
            else ""
        )
        evidence.append(
            f"ebpf: {row['missed_merges_ps']:.0f} merges/s refused and {row['splits_ps']:.0f} "
            f"pieces/s split off, of {row['issued_ps']:.0f} requests/s issued{size}"
        )
    else:
        evidence.append("refused merges and splits not counted (no --ebpf): the page needs them")
    return evidence


def _collapse_fix(owner, q, k, split_first):
    """The fix of the setting the evidence points at: nomerges for refused merges (and the
    layered shape), max_sectors_kb first for pieces split off."""
    fixes = []
    if q.get(NOMERGES.file):
        fixes.append((NOMERGES, 0))
    if q.get(MAX_SECTORS_KB.file, 0) < k["max_sectors_floor_bytes"]:
        target = checks.max_sectors_target(q.get(MAX_HW_SECTORS_KB.file, 0)) // 1024 * 1024
        fixes.insert(0 if split_first else len(fixes), (MAX_SECTORS_KB, target))
    if not fixes:
        return (
            "neither nomerges nor max_sectors_kb: look at the layer in between (snapshot chunk "
            "size, dm-crypt)",
            [],
        )
    fix = checks.queue_fix(owner, *fixes[0])
    return fix["fix"], fix["spec"]


def _refused(row, k):
    """host_device_operation:blockstack_collapse_refused:rate: most requests issued are refused
    merges, at a real rate."""
    missed, issued = row.get("missed_merges_ps"), row.get("issued_ps")
    return (
        bool(issued)
        and missed >= k["missed_merges_min_rate"]
        and missed >= k["missed_merges_min_ratio"] * issued
    )


def _split(row, k):
    """host_device_operation:blockstack_collapse_split:rate: most requests issued are pieces split
    off larger bios, and they are tiny."""
    splits, issued = row.get("splits_ps"), row.get("issued_ps")
    return (
        bool(issued)
        and splits >= k["split_min_rate"]
        and splits >= k["split_min_ratio"] * issued
        and row["issued_sectors"] <= k["collapse_max_sectors"]
    )


def _at_limit(host, row, dev, k):
    """Without eBPF, the split collapse as diskstats shows it: the device serves tiny requests
    (<= collapse_max_sectors) at a real rate (>= split_min_rate), on average at least 90 % of its
    max_sectors_kb, and that limit is below the floor (max_sectors_floor_bytes): requests are
    being cut at the limit. max_sectors_kb in KiB when it holds, else None. With eBPF the
    counted pieces decide instead (_split)."""
    if "issued_ps" in row:
        return None
    limit = host.queue.get(host.queue_owner(dev), {}).get(MAX_SECTORS_KB.file)
    if not limit or limit >= k["max_sectors_floor_bytes"]:
        return None
    limit_sectors = limit / 512
    if (
        row["rps"] >= k["split_min_rate"]
        and row["sectors"] <= k["collapse_max_sectors"]
        and row["sectors"] >= 0.9 * limit_sectors
    ):
        return round(limit / 1024)
    return None


def _layered_upper(host, rows, dev, op, k):
    """host_device_operation:blockstack_collapse_layered:split_ratio: the nearest device above dev
    whose requests are many times larger and carry most of dev's bytes, when dev is where
    requests reach a driver (nothing beneath it, or a loop device) and serves tiny ones at a
    real rate; else None."""
    row = rows[dev][op]
    if host.lower.get(dev) and host.devices[dev].get("kind") != "loop":
        return None
    if not (
        row["rps"] >= k["collapse_min_iops"]
        and row["sectors"] <= k["collapse_max_sectors"]
        and row["kbps"]
    ):
        return None
    for upper in host.uppers(dev):
        up = rows.get(upper, {}).get(op)
        if (
            up
            and up["rps"]
            and up["sectors"] >= k["collapse_upper_min_sectors"]
            and up["sectors"] >= k["collapse_min_split_ratio"] * row["sectors"]
            and up["kbps"] >= k["collapse_min_upper_share"] * row["kbps"]
        ):
            return upper
    return None
