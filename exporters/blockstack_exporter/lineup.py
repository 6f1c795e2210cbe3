"""The doctor's --interval: two samples of the host, SECONDS apart, made into rates: each layer's
requests as iostat -x shows them (the lineup), with ebpf_exporter's counters on each device's own
requests and the block cgroups whose I/O they are."""

SECTOR = 512


class Sample:
    """One reading of the host: the exporter's collection, the findings' Host, diskstats, ebpf."""

    def __init__(self, host, errors, failed, diskstats, ebpf, when):
        self.host, self.errors, self.failed = host, errors, failed
        self.diskstats, self.ebpf, self.when = diskstats, ebpf, when


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
    """{("jbd2_credit_wait", dev): waits/s, ("jbd2_credit_wait_avg", dev): seconds,
    ("jbd2_checkpoint_share", dev): the share of the waits that found the journal full} for the
    checks."""
    if first.ebpf is None or second.ebpf is None:
        return None

    def delta(what, dev):
        return second.ebpf.get((what, dev, ""), 0.0) - first.ebpf.get((what, dev, ""), 0.0)

    out = {}
    for what, dev, *_ in second.ebpf:
        if what != "jbd2_credit_wait":
            continue
        count = delta("jbd2_credit_wait", dev)
        out[("jbd2_credit_wait", dev)] = count / elapsed
        if count > 0:
            out[("jbd2_credit_wait_avg", dev)] = delta("jbd2_credit_wait_seconds", dev) / count
            out[("jbd2_checkpoint_share", dev)] = delta("jbd2_checkpoint_waits", dev) / count
    return out
