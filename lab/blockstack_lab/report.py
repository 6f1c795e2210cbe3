"""The detection report of a run, Markdown: one row per check."""


def table(checks):
    """The detection table, Markdown."""
    rows = [
        "| scenario | phase | expected | observed | onset to notification | resolved after | correct |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        secs = f"{c.seconds:.0f} s" if c.seconds is not None else "-"
        res = f"{c.resolved_seconds:.0f} s" if c.resolved_seconds is not None else "-"
        rows.append(
            f"| {c.scenario} | {c.phase} | {c.expected} | {c.observed} | {secs} | {res} | {'yes' if c.correct else 'NO'} |"
        )
    return "\n".join(rows)
