"""The doctor's report: per stack from the top device down, the lineup and each finding with its
evidence, fix and persist recipes, as text for a person or JSON (--json)."""

import json

from . import checks
from .collectors.ebpf import parse_status
from .fs import ParseError, read_text
from .lineup import top_cgroups


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
