"""blockstack-doctor: reads a host once and names every block-stack misconfiguration, with the fix.

It reads what the exporter reads (the same collectors, the same --path.* flags), judges it with
the exporter's table of checks (checks.py, thresholds from alerts/config.yml) and prints, per
stack from the top device down, each finding: the device, what is wrong, the evidence read, why
it matters, the command that fixes it now and how to make the fix persist.

    blockstack-doctor                       # the whole host
    blockstack-doctor --device vg/snap      # the stacks holding one device
    blockstack-doctor --interval 5          # and each layer's requests over 5 s (iostat's lineup)
    blockstack-doctor --interval 5 --ebpf http://127.0.0.1:9435/metrics   # refused merges, splits,
                                            # and whose I/O (block cgroups) they hurt

Exit status: 0 no finding at warning or above, 1 findings at warning or above (or, with
--collector.ebpf.status-file, a set of BPF programs this kernel does not load), 2 something it
needs could not be read (a collector failed as a whole, no block devices, --device unknown,
ebpf_exporter unreachable, the status file); the findings it could make are printed all the same.
"""

import argparse
import json
import logging
import os
import re
import sys
import time

from . import __version__, checks, collectors, knobs, persist
from .collectors import ALL
from .collectors.ebpf import parse_status
from .fs import ParseError, read_text
from .scrape import BlockstackCollector, Paths, add_dm_flags, add_path_flags, deadline
from .settings import BY_FILE

log = logging.getLogger("blockstack_exporter")

COLLECTION_SECONDS = 60.0  # a one-off run may take its time (the exporter has a scrape's 4.5 s)
SECTOR = 512
COLLAPSE_SETTINGS = ("nomerges", "max_sectors_kb")  # the queue settings a collapse's fix changes
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
_LVM_SETTING = re.compile(
    r"^\s*(snapshot_autoextend_threshold|thin_pool_autoextend_threshold)\s*=\s*(\d+)",
    re.M | re.ASCII,
)


def parse_lvm_conf(text):
    """The autoextend thresholds set in lvm.conf (comments and unset ones are absent: lvm.conf(5)
    defaults both to 100, off)."""
    return {m[1]: int(m[2]) for m in _LVM_SETTING.finditer(text)}


def parse_diskstats(text):
    """/proc/diskstats (Documentation/admin-guide/iostats.rst) -> {device: (reads, reads merged,
    sectors read, writes, writes merged, sectors written)}."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 10 and all(x.isdigit() for x in f[3:10]):
            out[f[2]] = tuple(int(x) for x in (f[3], f[4], f[5], f[7], f[8], f[9]))
    return out


def read_ebpf(url, names, timeout=10):
    """Counters of ebpf_exporter by (what, device[, operation]): requests issued and their bytes,
    refused merges, splits, jbd2 credit waits and their seconds; and by (what, device, operation,
    cgroup) the bytes each block cgroup submitted (cgroup_bytes) and its refused merges plus
    split-off pieces (cgroup_collapse), the cgroup named by block_cgroup_admissions_total
    (cgroup_label). Its series carry the device number (`devno`, ebpf-configs/README.md); `names`
    ({devno: device}, the Host's numbers, as blockstack_device_number_info publishes them) names
    them."""
    import urllib.request  # only here: its import is a tenth of the doctor's start on a busy host

    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode("utf-8", "replace")
    return parse_ebpf(text, names)


EBPF_COUNTERS = {
    "ebpf_exporter_block_rq_size_bytes_count": "issued",
    "ebpf_exporter_block_rq_size_bytes_sum": "issued_bytes",
    "ebpf_exporter_block_rq_missed_merges_total": "missed_merges",
    "ebpf_exporter_block_bio_splits_total": "splits",
    "ebpf_exporter_jbd2_credit_wait_seconds_count": "jbd2_credit_wait",
    "ebpf_exporter_jbd2_credit_wait_seconds_sum": "jbd2_credit_wait_seconds",
    # per block cgroup (ebpf-configs/block_cgroups.bpf.h), summed as the rules' ebpf_block_cgroup_*
    "ebpf_exporter_block_cgroup_bio_bytes_total": "cgroup_bytes",
    "ebpf_exporter_block_cgroup_missed_merges_total": "cgroup_collapse",
    "ebpf_exporter_block_cgroup_splits_total": "cgroup_collapse",
}
CGROUP_ADMISSIONS = "ebpf_exporter_block_cgroup_admissions_total"
# A container's scope as the rules' `cgroup` label shows it: "docker-<64 hex>.scope" is
# "docker <first 12 hex>" (alerts/src/recording.rules.yml.in, ebpf_block_cgroup_*).
_CONTAINER_SCOPE = re.compile(
    r"(docker|cri-containerd|crio|libpod)-([0-9a-f]{12})[0-9a-f]*\.scope", re.ASCII
)


def cgroup_label(name):
    """A cgroup's directory name as the dashboard and the page show it."""
    m = _CONTAINER_SCOPE.fullmatch(name)
    return f"{m[1]} {m[2]}" if m else name


def parse_ebpf(text, names):
    """read_ebpf's counters from ebpf_exporter's exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    out, by_cgroup, named = {}, [], {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            device = names.get(s.labels.get("devno"))
            if not device:
                continue
            cgroup_id = s.labels.get("cgroup_id")
            if s.name == CGROUP_ADMISSIONS:
                named[(device, cgroup_id)] = cgroup_label(s.labels.get("cgroup", ""))
            elif what := EBPF_COUNTERS.get(s.name):
                key = (what, device, s.labels.get("operation", ""))
                if cgroup_id is None:
                    out[key] = out.get(key, 0.0) + s.value
                else:
                    by_cgroup.append((key, cgroup_id, s.value))
    for (what, device, op), cgroup_id, value in by_cgroup:
        # the admissions and the counters are read from different maps: a cgroup admitted in
        # between has counts before its name
        name = named.get((device, cgroup_id)) or (
            "other" if cgroup_id == "0" else f"cgroup id {cgroup_id}"
        )
        key = (what, device, op, name)
        out[key] = out.get(key, 0.0) + value
    return out


class Sample:
    """One reading of the host: the exporter's collection, the findings' Host, diskstats, ebpf."""

    def __init__(self, host, errors, failed, diskstats, ebpf, when):
        self.host, self.errors, self.failed = host, errors, failed
        self.diskstats, self.ebpf, self.when = diskstats, ebpf, when


class Doctor:
    def __init__(self, args, knob_values):
        self.args, self.knobs = args, knob_values
        every = collectors.build(
            ALL, knob_values, dmsetup=args.dmsetup, dm_timeout=args.dmsetup_timeout
        )
        self.findings = every[-1]
        self.collector = BlockstackCollector(every, Paths(args.sysfs, args.procfs, args.dev))
        self.messages = []
        self._handler = _Remember(self.messages)
        log.addHandler(self._handler)
        log.propagate = False

    def sample(self, with_rates):
        before = dict(self.collector.errors)
        with deadline(time.monotonic() + COLLECTION_SECONDS):
            families = self.collector.collect()
        failed = [
            s.labels["collector"]
            for f in families
            if f.name == "blockstack_scrape_collector_success"
            for s in f.samples
            if s.value == 0
        ]
        errors = {
            k: v - before.get(k, 0)
            for k, v in self.collector.errors.items()
            if v > before.get(k, 0)
        }
        diskstats = ebpf = None
        if with_rates:
            diskstats = parse_diskstats(read_text(os.path.join(self.args.procfs, "diskstats")))
            if self.args.ebpf:
                numbers = self.findings.host.numbers
                ebpf = read_ebpf(self.args.ebpf, {n[1]: dev for dev, n in numbers.items()})
        return Sample(self.findings.host, errors, failed, diskstats, ebpf, time.monotonic())

    def lvm_conf(self):
        try:
            return parse_lvm_conf(read_text(self.args.lvmconf))
        except FileNotFoundError:
            return {}  # no lvm.conf: LVM's defaults
        except (OSError, ParseError) as e:
            self.messages.append(f"{self.args.lvmconf}: {e}")
            return None


class _Remember(logging.Handler):
    """The collectors' problem reports, kept for the report (once each)."""

    def __init__(self, messages):
        super().__init__(logging.WARNING)
        self.messages = messages

    def emit(self, record):
        text = record.getMessage()
        if text not in self.messages:
            self.messages.append(text)


# --- the lineup: iostat -x per layer of each stack ---------------------------------------------


def lineup(first, second, elapsed):
    """{device: {op: {rps, kbps, sectors (average request), merges_ps}}} between two samples (op
    is read or write); with ebpf_exporter also missed_merges_ps, splits_ps, issued_ps (requests
    issued to the driver, block_rq_issue) and issued_sectors (their average size, None when
    none was issued): what the rules' eBPF evidence reads; and cgroups, {cgroup: {kbps,
    collapse_ps}} of the block cgroups that submitted bytes or had merges refused or pieces
    split off."""
    out = {}
    cgroups = _cgroup_rates(first, second, elapsed)
    for dev, now in second.diskstats.items():
        then = first.diskstats.get(dev)
        if then is None:
            continue
        d = [max(0, a - b) for a, b in zip(now, then)]
        per = {}
        for op, (ios, merges, sectors) in (("read", d[0:3]), ("write", d[3:6])):
            row = {
                "rps": ios / elapsed,
                "kbps": sectors * SECTOR / 1024 / elapsed,
                "sectors": sectors / ios if ios else 0.0,
                "merges_ps": merges / elapsed,
            }
            if second.ebpf is not None and first.ebpf is not None:
                grew = {
                    what: max(
                        0.0,
                        second.ebpf.get((what, dev, op), 0.0)
                        - first.ebpf.get((what, dev, op), 0.0),
                    )
                    for what in ("missed_merges", "splits", "issued", "issued_bytes")
                }
                row.update(
                    missed_merges_ps=grew["missed_merges"] / elapsed,
                    splits_ps=grew["splits"] / elapsed,
                    issued_ps=grew["issued"] / elapsed,
                    issued_sectors=grew["issued_bytes"] / SECTOR / grew["issued"]
                    if grew["issued"]
                    else None,
                    cgroups=cgroups.get((dev, op), {}),
                )
            per[op] = row
        out[dev] = per
    return out


def _cgroup_rates(first, second, elapsed):
    """{(device, op): {cgroup: {kbps, collapse_ps}}} between two samples, without cgroups that did
    neither."""
    out = {}
    if first.ebpf is None or second.ebpf is None:
        return out
    for key, value in second.ebpf.items():
        if len(key) != 4:
            continue
        what, dev, op, cgroup = key
        grew = max(0.0, value - first.ebpf.get(key, 0.0)) / elapsed
        if grew:
            rates = out.setdefault((dev, op), {}).setdefault(
                cgroup, {"kbps": 0.0, "collapse_ps": 0.0}
            )
            if what == "cgroup_bytes":
                rates["kbps"] += grew / 1024
            else:
                rates["collapse_ps"] += grew
    return out


def top_cgroups(counts, n=3):
    """The n cgroups with the most of `counts` ({cgroup: count}) and their shares of them all,
    "postgresql.service (92%), backup.service (7%)"; "" when there are none."""
    total = sum(v for v in counts.values() if v > 0)
    top = sorted((c for c in counts.items() if c[1] > 0), key=lambda c: (-c[1], c[0]))[:n]
    shares = ((name, 100 * v / total) for name, v in top)
    return ", ".join(f"{name} ({f'{p:.0f}' if p >= 0.5 else '<1'}%)" for name, p in shares)


def ebpf_rates(first, second, elapsed):
    """{("jbd2_credit_wait", dev): waits/s, ("jbd2_credit_wait_avg", dev): seconds} for the checks."""
    out = {}
    if first.ebpf is None or second.ebpf is None:
        return None
    for (what, dev, *_), value in second.ebpf.items():
        if what == "jbd2_credit_wait":
            count = value - first.ebpf.get((what, dev, ""), 0.0)
            secs = second.ebpf.get(("jbd2_credit_wait_seconds", dev, ""), 0.0) - first.ebpf.get(
                ("jbd2_credit_wait_seconds", dev, ""), 0.0
            )
            out[("jbd2_credit_wait", dev)] = count / elapsed
            if count > 0:
                out[("jbd2_credit_wait_avg", dev)] = secs / count
    return out


def collapse_findings(host, rows, k):
    """merge_collapse on the interval, judged as the rules judge it (alerts/src/recording.rules.yml.in):
    critical only on evidence counted on the device's own requests by ebpf_exporter (--ebpf), the
    evidence BlockStackMergeCollapse pages on: merging refused (blockstack_collapse_refused) or
    requests split into tiny pieces (blockstack_collapse_split). The layered shape (a device
    where requests reach a driver serves small requests while a device above it sends large
    ones carrying most of its bytes: blockstack_collapse_layered) is info, context as the
    dashboard shows it: another tenant's small I/O on a shared disk looks the same."""
    out = []
    for dev in sorted(rows):
        if dev not in host.devices:
            continue
        for op, row in rows[dev].items():
            upper = _layered_upper(host, rows, dev, op, k)
            refused, split = _refused(row, k), _split(row, k)
            if not (upper or refused or split):
                continue
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
                evidence.append(
                    "refused merges and splits not counted (no --ebpf): the page needs them"
                )
            owner = host.queue_owner(dev)
            q = host.queue.get(owner, {})
            shown = (f"{a} {BY_FILE[a].in_file(q.get(a, 0)):.0f}" for a in COLLAPSE_SETTINGS)
            evidence.append(f"/sys/block/{owner}/queue: {', '.join(shown)}")
            fix, spec = _collapse_fix(owner, q, k, split_first=split and not refused)
            proves = "merging refused" if refused else "requests split" if split else "layered"
            what = (
                f"{proves}: {dev} {op}s {row['sectors']:.0f}-sector requests at {row['rps']:.0f}/s"
            )
            whose = top_cgroups({c: r["collapse_ps"] for c, r in row.get("cgroups", {}).items()})
            if (refused or split) and whose:
                what += f", mostly from {whose}"
            if not (refused or split):
                what += (
                    f" beneath {host.label(upper)}'s {rows[upper][op]['sectors']:.0f}-sector ones; no page "
                    f"without refused merges or splits counted on {dev}'s own requests"
                )
            out.append(
                checks.Finding(
                    "merge_collapse",
                    dev,
                    "critical" if refused or split else "info",
                    what,
                    evidence,
                    fix,
                    "see the setting's own finding; docs/runbook.md#blockstackmergecollapse",
                    MERGE_COLLAPSE.source,
                    spec=spec,
                )
            )
    return out


MERGE_COLLAPSE = checks.Check(
    "merge_collapse",
    collapse_findings,
    "merge collapse over the interval",
    checks.NVME_WRITEUP,
    needs="interval",
    alert="BlockStackMergeCollapse",
    severities=("critical", "info"),
    doc=(
        "`--interval` only, judged as the collapse rules judge it: critical on the page's "
        "evidence, counted on the device's own requests by ebpf_exporter (`--ebpf`: merging "
        "refused, or requests split into tiny pieces); info for the layered shape alone (small "
        "requests where they reach a driver beneath a device sending large ones: the dashboard's "
        "context, and another tenant's small I/O on a shared disk looks the same)"
    ),
)


def _collapse_fix(owner, q, k, split_first):
    """The fix of the setting the evidence points at: nomerges for refused merges (and the
    layered shape), max_sectors_kb first for pieces split off."""
    fixes = []
    if q.get("nomerges"):
        fixes.append(("nomerges", 0))
    if q.get("max_sectors_kb", 0) < k["max_sectors_floor_bytes"]:
        target = checks.max_sectors_target(q.get("max_hw_sectors_kb", 0)) // 1024 * 1024
        fixes.insert(0 if split_first else len(fixes), ("max_sectors_kb", target))
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


# --- output ------------------------------------------------------------------------------------


def stacks_of(host, only=None):
    """[(top, [devices top first])] of every stack, or of those holding `only`."""
    out = []
    for top in host.tops():
        devices = host.stack(top)
        if only is None or only in devices:
            out.append((top, devices))
    return out


def ebpf_sets(status_file, problems):
    """{set: {config, errors}} from select-configs.sh's status file ({} without one; a problem if
    it cannot be read)."""
    if not status_file:
        return {}
    try:
        rows = parse_status(read_text(status_file))
    except (OSError, ParseError) as e:
        problems.append(f"--collector.ebpf.status-file {status_file}: {e}")
        return {}
    return {name: {"config": chosen, "errors": errors} for name, chosen, errors in rows}


def _ebpf_lines(sets):
    """The sets of BPF programs this kernel does not load, first in the report: without the block
    set no merge collapse can page on this host."""
    lines = []
    for name, s in sets.items():
        errors = "; ".join(f"{variant}: {error}" for variant, error in s["errors"].items())
        if not s["config"]:
            blind = (
                "no merge collapse can page on this host"
                if name == "block"
                else "its alerts cannot fire"
            )
            lines += [
                f"WARNING ebpf_evidence_missing: no {name} BPF programs load on this kernel: {blind}",
                f"    evidence  {errors or 'no variant built'}",
                "    fix now   a kernel from 5.10 on with BTF (/sys/kernel/btf/vmlinux), or ebpf_exporter's "
                '--btf.path with a BTF file for this kernel (ebpf-configs/README.md, "Kernels")',
                "",
            ]
        elif errors:
            lines.append(f"ebpf: {name} runs as {s['config']} ({errors})")
    return lines + ([""] if lines and lines[-1] else [])


def render_text(report, host):
    lines = _ebpf_lines(report.get("ebpf_sets", {}))
    counts = {s: 0 for s in checks.SEVERITIES}
    for f in report["findings"]:
        counts[f.severity] += 1
    by_device = {}
    for f in report["findings"]:
        by_device.setdefault(f.device, []).append(f)
    shown = set()
    for top, devices in report["stacks"]:
        mine = [f for d in devices if d not in shown for f in by_device.get(d, [])]
        rows = report.get("lineup")
        if (
            not mine
            and not report["narrowed"]
            and not (rows and any(_busy(rows.get(d)) for d in devices))
        ):
            continue
        shown.update(devices)
        layers = " > ".join(", ".join(host.label(d) for d in layer) for layer in host.layers(top))
        lines += [f"stack {host.label(top)}: {layers}"]
        if rows:
            lines += _lineup_table(host, devices, rows, report["ebpf"])
        order = {d: i for i, d in enumerate(devices)}
        for f in sorted(mine, key=lambda f: (checks.SEVERITIES.index(f.severity), order[f.device])):
            lines += [
                f"  {f.severity.upper()} {f.check}: {host.label(f.device)}",
                f"    what      {f.what}",
            ]
            lines += [f"    {'evidence' if i == 0 else '':9} {e}" for i, e in enumerate(f.evidence)]
            lines += [f"    why       {f.why}", f"    fix now   {f.fix}"]
            lines += _persist_lines(f)
        lines.append("")
    for message in report["problems"]:
        lines.append(f"problem: {message}")
    total = len(report["findings"])
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    shown_stacks = len(report["stacks"])
    scope = f"{len(host.devices)} devices, {shown_stacks} stack{'s' if shown_stacks != 1 else ''}"
    lines.append(
        f"{scope}{' shown' if report['narrowed'] else ''}: "
        f"{total} finding{'s' if total != 1 else ''}{f' ({summary})' if summary else ''}"
    )
    return "\n".join(lines) + "\n"


def _persist_lines(f):
    """The persist line: each recipe's summary, what it needs first and its pasteable command."""
    if not f.recipes:
        return [f"    persist   {f.persist}"]
    out = []
    for i, r in enumerate(f.recipes):
        out.append(f"    {'persist' if i == 0 else '':9} {'or: ' if i else ''}{r['summary']}")
        if r.get("needs"):
            out.append(f"              needs {r['needs']}")
        out.append(f"              $ {r['command']}")
    return out


def _busy(per_op):
    return bool(per_op) and any(r["rps"] > 0 for r in per_op.values())


def _lineup_table(host, devices, rows, ebpf):
    head = f"    {'device':34} {'op':5} {'req/s':>8} {'kB/s':>9} {'avg sect':>8} {'merges/s':>8}"
    if ebpf:
        head += f" {'refused/s':>9} {'splits/s':>8}"
    out = [head]
    for d in devices:
        for op, r in rows.get(d, {}).items():
            if r["rps"] <= 0:
                continue
            line = (
                f"    {host.label(d)[:34]:34} {op:5} {r['rps']:8.1f} {r['kbps']:9.0f} {r['sectors']:8.1f} "
                f"{r['merges_ps']:8.1f}"
            )
            if ebpf:
                line += f" {r.get('missed_merges_ps', 0):9.1f} {r.get('splits_ps', 0):8.1f}"
            out.append(line)
            whose = top_cgroups({c: v["kbps"] for c, v in r.get("cgroups", {}).items()})
            if whose:
                out.append(f"    {'':34} bytes from {whose}")
    return out if len(out) > 1 else []


def render_json(report, host):
    return (
        json.dumps(
            {
                "devices": {
                    d: {"label": host.label(d), **host.devices[d], "lower": host.lower.get(d, [])}
                    for d in sorted(host.devices)
                },
                "stacks": [{"top": top, "devices": devices} for top, devices in report["stacks"]],
                "findings": [f.as_dict() for f in report["findings"]],
                "lineup": report.get("lineup"),
                "problems": report["problems"],
                "ebpf_sets": report["ebpf_sets"],
                "exit": report["exit"],
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )


# --- command line ------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="blockstack-doctor",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_path_flags(p)
    p.add_argument(
        "--path.lvmconf",
        dest="lvmconf",
        default="/etc/lvm/lvm.conf",
        help="lvm.conf, read for the autoextend thresholds (default %(default)s)",
    )
    p.add_argument(
        "--path.rootfs",
        dest="rootfs",
        default="/",
        help="the root holding /etc, /run and /usr: udev rules, udev's database and tuned profiles, read "
        "for the persist recipes and what would set a queue attribute again (default %(default)s)",
    )
    add_dm_flags(p, timeout=10.0)
    p.add_argument(
        "--config.knobs",
        dest="knobs",
        default=None,
        metavar="PATH",
        help="the alerts' config.yml whose thresholds to judge by (default: the copy shipped "
        "with the exporter)",
    )
    p.add_argument(
        "--device", help="only the stacks holding this device (dm-3, /dev/mapper/vg-lv, vg/lv, sda)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="read twice, SECONDS apart, and show each layer's requests (iostat's lineup), COW fill "
        "rates and live collapses",
    )
    p.add_argument(
        "--ebpf",
        metavar="URL",
        help="ebpf_exporter's /metrics: refused merges, splits and jbd2 credit waits in the "
        "lineup, with the block cgroups whose I/O they are (needs --interval)",
    )
    p.add_argument(
        "--collector.ebpf.status-file",
        dest="ebpf_status_file",
        metavar="PATH",
        help="ebpf-configs/select-configs.sh's status file (make up: STATE_DIR/ebpf-status.tsv): a set "
        "of BPF programs this kernel does not load is a warning (exit 1)",
    )
    p.add_argument("--version", action="version", version=__version__)
    args = p.parse_args(argv)
    if args.ebpf and not args.interval:
        p.error("--ebpf needs --interval (its counters are read twice)")
    if args.interval is not None and not 0 < args.interval <= 3600:
        p.error("--interval: between 0 and 3600 seconds")
    return args


def run(args, out=sys.stdout):
    try:
        knob_values = knobs.load(args.knobs, (*checks.KNOBS, *INTERVAL_KNOBS))
    except knobs.KnobsError as e:
        print(f"blockstack-doctor: --config.knobs: {e}", file=sys.stderr)
        return 2
    doctor = Doctor(args, knob_values)
    problems = doctor.messages
    try:
        first = doctor.sample(with_rates=args.interval is not None)
        second = None
        if args.interval:
            time.sleep(args.interval)
            second = doctor.sample(with_rates=True)
    except (OSError, ParseError, ValueError) as e:  # URLError is an OSError
        print(f"blockstack-doctor: {e}", file=sys.stderr)
        return 2
    finally:
        log.removeHandler(doctor._handler)
    now = second or first
    host = now.host or checks.Host()
    host.lvm_conf = doctor.lvm_conf()
    report = {"lineup": None, "ebpf": bool(args.ebpf), "narrowed": bool(args.device)}
    extra = []
    if second:
        elapsed = second.when - first.when
        host.previous, host.elapsed = first.host, elapsed
        host.ebpf = ebpf_rates(first, second, elapsed)
        report["lineup"] = lineup(first, second, elapsed)
        extra = collapse_findings(host, report["lineup"], knob_values)
    failed = []
    findings = checks.evaluate(host, knob_values, failed=failed) + extra
    try:
        persist.attach(persist.Context(args.sysfs, args.rootfs), host, findings)
    except Exception as e:  # noqa: BLE001 - a recipe's bug must not hide the findings
        problems.append(f"persist recipes failed: {e!r}")
    problems += [f"check {check} failed: {e!r}" for check, e in failed]
    unreadable_checks = bool(failed)
    findings.sort(key=lambda f: checks.SEVERITIES.index(f.severity))
    unreadable = bool(now.failed) or not host.devices or unreadable_checks
    if now.failed:
        problems.append(f"collector(s) {', '.join(now.failed)} failed as a whole")
    if not host.devices:
        problems.append(f"no block devices under {args.sysfs}/class/block")
    only = None
    if args.device:
        only = host.resolve(args.device)
        if only is None:
            problems.append(f"--device {args.device}: no such block device")
            unreadable = True
    report["stacks"] = stacks_of(host, only) if only or not args.device else []
    in_scope = {d for _, devices in report["stacks"] for d in devices}
    report["findings"] = [f for f in findings if f.device in in_scope or not host.devices]
    report["problems"] = problems
    serious = any(f.severity in ("critical", "warning") for f in report["findings"])
    report["ebpf_sets"] = ebpf_sets(args.ebpf_status_file, problems)
    blind = any(not s["config"] for s in report["ebpf_sets"].values())
    unreadable |= args.ebpf_status_file is not None and report["ebpf_sets"] == {}
    report["exit"] = 2 if unreadable else 1 if serious or blind else 0
    out.write(render_json(report, host) if args.json else render_text(report, host))
    return report["exit"]


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.exit(run(args))


if __name__ == "__main__":
    main()
