"""The verdict on a corpus case from its evidence (evidence.py): expected pages against the pages
at the receiver and the pages Prometheus still has, as a `Check` with the page counts that
corpus.summary turns into precision and recall."""

from .scenarios import Check


def judge(r, case, onset, evidence):
    """The Check of `case` whose onset was at `onset`, from `evidence` (None: no stack)."""
    lab = r.lab
    expected = ("page on " + ", ".join(lab.name(p) for p in case.pages)) if case.sick else "no page"
    phase = "sick" if case.sick else "healthy"
    if evidence is None:
        return Check(case.name, phase, expected, "not observed (no stack)", True)
    got = evidence.pages
    # one page = one alert (alertname, device, operation) with one startsAt: an alert that
    # resolves and fires again counts twice; the same alert repeated in a later notification of
    # its group (another alert joined) counts once
    starts = {}
    for n in got:
        key = (n.alertname, n.device, n.labels.get("operation", ""))
        starts.setdefault(key, set()).add(round(n.starts_at))
    first = {}
    for n in got:
        first.setdefault(n.device, n)
    suppressed = evidence.suppressed
    late = sorted(
        {
            (a, d, s)
            for a, d, s, sev in evidence.alerts
            if sev == "critical"
            and (a, d) not in suppressed
            and not any(k[0] == a and k[1] == d for k in starts)
        }
    )
    parts = [
        f"page {a} on {d} ({op})" + (f" x{len(s)}" if len(s) > 1 else "")
        for (a, d, op), s in sorted(starts.items())
    ]
    parts += [f"{s} page {a} on {d} in Prometheus" for a, d, s in late]
    observed = ", ".join(parts) or "no page"
    want = {lab.name(p) for p in case.pages}
    paged = {d for (_, d, _) in starts} | {d for _, d, _ in late}
    once = all(len(s) == 1 for s in starts.values())
    correct = paged == want and once
    seconds = None
    if case.sick and want <= set(first):
        seconds = max(first[d].received_at for d in want) - onset
        for d in sorted(want):
            n = first[d]
            r.say(
                f"+{n.received_at - onset:.0f}s PAGE {n.alertname} on {d}: {n.annotations.get('summary', '')}"
            )
            for key in ("description", "doctor"):
                if n.annotations.get(key):
                    r.say(f"    {key}: {' '.join(n.annotations[key].split())}")
    r.say(
        f"{case.name}: expected {expected}; observed {observed}"
        + (f" after {seconds:.0f} s" if seconds is not None else "")
        + (" - OK" if correct else " - WRONG")
    )
    check = Check(case.name, phase, expected, observed, correct, seconds)
    check.onset = onset
    check.expected_pages = len(want)
    check.true_pages = len(want & paged)
    check.false_pages = len(paged - want) + sum(len(s) - 1 for s in starts.values())
    check.page_seconds = {d: first[d].received_at - onset for d in want if d in first}
    return check


def pages_after_fix(r, case, check, late):
    """After a fix by removal: a page in `late` (pages that started after the fix: one from the
    window before it, or under a new identity) makes the check wrong, each a false page."""
    starts = {
        (n.alertname, n.device, n.labels.get("operation", ""), round(n.starts_at)) for n in late
    }
    if starts:
        check.false_pages += len(starts)
        check.correct = False
        check.observed += "; after the fix " + ", ".join(
            f"page {a} on {d} ({op})" for a, d, op, _ in sorted(starts)
        )
        r.say(f"{case.name}: new pages after the fix - WRONG: {sorted(starts)}")
