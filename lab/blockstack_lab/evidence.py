"""What the stack shows of a corpus case, read for its verdict (verdict.py): waiting until the
previous case's pages clear and until the expected pages arrive, the pages at the receiver and
the alerts in Prometheus and Alertmanager after a phase, and the resolves at the end of a run.
Without a stack (`r.view` None) there is nothing to read: the waits only narrate."""

import dataclasses
import time

from blockstack_testsupport import procs


@dataclasses.dataclass
class Evidence:
    pages: list  # the pages at the receiver since the onset (view.Notified), oldest first
    suppressed: set  # {(alertname, device)} Alertmanager holds back
    alerts: list  # [(alertname, device, state, severity)] pending or firing in Prometheus


def settle(r, devices):
    """Wait (bounded) until no page is pending or firing on these devices: a previous case's page
    held by keep_firing_for must not count in this one."""
    if r.view is None:
        return

    def quiet():
        return not [
            a for a in r.view.alerts(sorted(devices), with_severity=True) if a[3] == "critical"
        ]

    try:
        procs.wait_until(
            "pages on the case's devices to clear", quiet, r.t.settle_timeout, interval=2
        )
    except TimeoutError:
        r.say(f"still paging after {r.t.settle_timeout:.0f} s on {sorted(devices)}")


def wait_pages(r, case, onset):
    """Until every expected page has arrived at the receiver (or page_timeout); then linger."""
    if r.view is None:
        r.watch(r.t.page_timeout, case.roles(), onset)
        return
    want = {r.lab.name(role) for role in case.pages}

    def arrived():
        got = {n.device for n in pages_since(r, onset, want)}
        return got >= want

    if r.watch(r.t.page_timeout, case.roles(), onset, until=arrived):
        time.sleep(r.t.linger)


def pages_since(r, onset, devices):
    return [n for n in r.new_firing(onset, devices) if n.path == "/page"]


def collect(r, onset, devices):
    """The evidence on these devices since `onset`; None without a stack."""
    if r.view is None:
        return None
    pages = pages_since(r, onset, devices)
    suppressed = r.view.suppressed()
    return Evidence(pages, suppressed, r.view.alerts(sorted(devices), with_severity=True))


def resolves(r, checks, timeout=200):
    """Fill in each sick check's seconds from the fix to the resolve at the receiver, waiting
    (bounded) for the last ones."""
    if r.view is None:
        return
    pending = [c for c in checks if getattr(c, "fixed_at", None) and c.seconds is not None]

    def fill():
        for c in pending:
            if c.resolved_seconds is not None:
                continue
            devices = set(c.page_seconds)
            done = {}  # the first resolve of each device after the fix (later cases page it again)
            for n in r.view.notifications(c.fixed_at):
                if n.status == "resolved" and n.device in devices:
                    done.setdefault(n.device, n.received_at)
            if set(done) >= devices:
                c.resolved_seconds = max(done.values()) - c.fixed_at
        return all(c.resolved_seconds is not None for c in pending)

    try:
        procs.wait_until("the last resolves", fill, timeout, interval=5)
    except TimeoutError:
        r.say(f"some resolves did not arrive within {timeout} s")
