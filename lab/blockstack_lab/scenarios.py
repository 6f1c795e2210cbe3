"""Named lab scenarios: real incidents reproduced on the lab's loop devices (lab.py), and healthy
I/O that must stay quiet, each narrated as the stack sees it (view.py: the lineup per layer, the
alert state, the page).

Each scenario returns `Check`s: what was expected (page / no page / alert at the ticket
receiver), what the stack did (notifications at the receiver since the onset, alerts pending or
firing in Prometheus), whether they match, and the seconds from onset to the notification.
"""

import dataclasses
import os
import time

from blockstack_testsupport import procs

from . import fio
from .lab import fio_tag
from .view import Diskstats


@dataclasses.dataclass
class Expect:
    kind: str  # "page", "alert" (warning at the ticket receiver) or "none"
    alertname: str = ""
    role: str = ""  # the lab device the alert must name
    nothing: str = "no page"  # how to say "none"

    def describe(self, lab):
        if self.kind == "none":
            return self.nothing
        return f"{self.kind} {self.alertname} on {lab.name(self.role)}"


@dataclasses.dataclass
class Check:
    scenario: str
    phase: str
    expected: str
    observed: str
    correct: bool
    seconds: float = None  # onset to notification at the receiver
    resolved_seconds: float = None


@dataclasses.dataclass
class Timing:
    """How long phases last. Defaults suit the 5 s scrape of `make up` (alerts/README.md "Time to
    page": <= 55 s onset to page)."""

    warmup: float = 25  # healthy load before a fault: the 20 s rate windows fill
    quiet: float = 75  # a must-not-page phase: longer than the worst-case time to page
    page_timeout: float = 90  # a page later than this is a miss
    resolve_timeout: float = 120
    alert_timeout: float = (
        300  # the jbd2 warning: rate window + for + the ticket route's group_wait 30 s
    )
    journal_quiet: float = 180  # the large journal: as long as the warning would need, and more
    settle_timeout: float = 240
    linger: float = 10  # after a page, how long other notifications may still arrive
    narrate_every: float = 15
    corpus_warmup: float = 15  # corpus (corpus.py): healthy load before a sick case's fault
    corpus_quiet: float = 55  # corpus: a healthy case; longer than the worst-case 40 s to page


class Runner:
    """Runs scenarios on a lab against a stack (or none: narration from /proc/diskstats only)."""

    def __init__(self, lab, view=None, timing=None, say=print, tag=None):
        self.lab, self.view, self.t = lab, view, timing or Timing()
        # every fio is named TAG-WORKLOAD: `sweep_stale` finds a killed lab's fio by it
        self.say, self.tag = say, tag or fio_tag(os.getpid())
        self.diskstats = Diskstats()
        self.narration = []  # what narrate() saw, oldest first

    # narration

    def narrate(self, roles, onset=None):
        """Record what the stack sees of these roles now in `narration` (the lineup per device
        and, with a stack, the alerts pending or firing), and say it."""
        names = self.lab.names()
        devices = [names[r] for r in roles if r in names]
        entry = {
            "time": time.time(),
            "onset": onset,
            "roles": {names[r]: r for r in roles if r in names},
        }
        if self.view is None:
            entry.update(source="iostat", lineup=self.diskstats.lineup(devices))
        else:
            entry.update(
                source="Prometheus",
                lineup=self.view.lineup(devices),
                alerts=self.view.alerts(devices),
            )
        self.narration.append(entry)
        when = f"+{entry['time'] - onset:.0f}s " if onset else ""
        parts = []
        for dev, role in entry["roles"].items():
            ops = entry["lineup"].get(dev, {})
            figures = ", ".join(
                f"{op} {rate:.0f}/s x {size:.1f} sectors"
                for op, (rate, size) in sorted(ops.items())
            )
            parts.append(f"{dev} ({role}): {figures or 'idle'}")
        self.say(f"{when}lineup ({entry['source']}): " + "; ".join(parts))
        if "alerts" in entry:
            self.say(
                f"{when}alerts: "
                + (
                    ", ".join(f"{a} on {d} {s}" for a, d, s in entry["alerts"])
                    or "none pending or firing"
                )
            )

    def watch(self, seconds, roles, onset=None, until=None):
        """Narrate every narrate_every seconds for `seconds`, or until `until()` is truthy."""
        deadline = time.monotonic() + seconds
        next_say = time.monotonic() + min(self.t.narrate_every, seconds)
        while time.monotonic() < deadline:
            if until is not None:
                value = until()
                if value:
                    return value
            if time.monotonic() >= next_say:
                self.narrate(roles, onset)
                next_say += self.t.narrate_every
            time.sleep(1)
        return until() if until is not None else None

    def fio(self, args, name):
        return fio.background(args, name=f"{self.tag}-{name}")

    # observation

    def new_firing(self, onset, devices):
        """The firing alerts on these devices notified since onset that started after it."""
        return [
            n
            for n in self.view.notifications(onset)
            if n.status == "firing" and n.device in devices and n.starts_at >= onset - 1
        ]

    def settle(self):
        """Wait until no alert is pending or firing on a lab device (the previous scenario's
        resolve), bounded."""
        if self.view is None:
            return
        devices = list(self.lab.names().values())
        try:
            procs.wait_until(
                "the lab's alerts to clear",
                lambda: not self.view.alerts(devices),
                self.t.settle_timeout,
                interval=2,
            )
        except TimeoutError:
            self.say(
                f"still active after {self.t.settle_timeout:.0f} s: {self.view.alerts(devices)}"
            )

    def observe(self, scenario, phase, expect, onset, roles):
        """Watch a phase that began at `onset` (Unix time) and judge it against `expect`."""
        lab = self.lab
        expected = expect.describe(lab)
        if self.view is None:
            self.watch(self.t.quiet if expect.kind == "none" else self.t.page_timeout, roles, onset)
            return Check(scenario, phase, expected, "not observed (no stack)", True)
        devices = set(lab.names().values())
        seconds = None
        if expect.kind == "none":
            self.watch(self.t.quiet, roles, onset)
        else:
            path = "/page" if expect.kind == "page" else "/ticket"
            target = lab.name(expect.role)
            timeout = self.t.page_timeout if expect.kind == "page" else self.t.alert_timeout

            def arrived():
                return [
                    n
                    for n in self.new_firing(onset, devices)
                    if n.path == path and n.alertname == expect.alertname and n.device == target
                ]

            hit = self.watch(timeout, roles, onset, until=arrived)
            if hit:
                seconds = hit[0].received_at - onset
                self.say(
                    f"+{seconds:.0f}s {'PAGE' if path == '/page' else 'TICKET'} at the receiver ({path}): "
                    f"{hit[0].alertname} on {hit[0].device}: {hit[0].annotations.get('summary', '')}"
                )
                for key in ("likely_cause", "description"):
                    if hit[0].annotations.get(key):
                        self.say(f"    {key}: {' '.join(hit[0].annotations[key].split())}")
                time.sleep(self.t.linger)
        got = self.new_firing(onset, devices)
        # what reached the receiver: the verdict
        seen = {(n.alertname, n.device, "page" if n.path == "/page" else "alert") for n in got}
        # what Prometheus has that did not: a pending or firing page, or a firing warning, that
        # Alertmanager does not hold back would arrive shortly, so it counts; inhibited alerts and
        # warnings still inside their `for:` (minutes) are reported but do not
        suppressed = self.view.suppressed()
        extra, late = [], set()
        for a, d, state, severity in self.view.alerts(devices, with_severity=True):
            if any(x[0] == a and x[1] == d for x in seen):
                continue
            if severity == "critical" and (a, d) not in suppressed:
                late.add((a, d, f"{state} page in Prometheus"))
            elif state == "firing" and (a, d) not in suppressed:
                late.add((a, d, f"firing {severity} in Prometheus"))
            else:
                why = (
                    "inhibited"
                    if (a, d) in suppressed
                    else f"{severity} {state}, not at the receiver"
                )
                extra.append(f"{a} on {d} ({why})")
        seen |= late
        observed = ", ".join(f"{kind} {a} on {d}" for a, d, kind in sorted(seen)) or expect.nothing
        if extra:
            observed += "; also " + ", ".join(sorted(extra))
        if expect.kind == "none":
            correct = not seen
        else:
            want = "page" if expect.kind == "page" else "alert"
            correct = seconds is not None and {(a, d, k) for a, d, k in seen} == {
                (expect.alertname, lab.name(expect.role), want)
            }
        self.say(
            f"{scenario} / {phase}: expected {expected}; observed {observed}"
            + (f" after {seconds:.0f} s" if seconds is not None else "")
            + (" - OK" if correct else " - WRONG")
        )
        return Check(scenario, phase, expected, observed, correct, seconds)

    def resolved(self, check, expect, since):
        """After a fault is undone: seconds until the receiver got the resolve, bounded."""
        if self.view is None or check.seconds is None:
            return
        target = self.lab.name(expect.role)

        def resolve():
            return [
                n
                for n in self.view.notifications(since)
                if n.status == "resolved" and n.alertname == expect.alertname and n.device == target
            ]

        hit = self.watch(self.t.resolve_timeout, ["single", "upper", "lower"], since, until=resolve)
        if hit:
            check.resolved_seconds = hit[0].received_at - since
            self.say(
                f"+{check.resolved_seconds:.0f}s resolved at the receiver: {expect.alertname} on {target}"
            )
        else:
            self.say(f"no resolve within {self.t.resolve_timeout:.0f} s")


def _seq_read(dev):
    return [*fio.SEQ_BATCHED_READ, f"--filename={dev}", "--readonly"]


def _collapse(r, scenario, phase, read_role, fault_role, attr, value):
    """Batched sequential reads on read_role; fault_role's ATTR -> value and back. Expected: the
    collapse page naming fault_role, and its resolve."""
    lab, roles, expect = (
        r.lab,
        sorted({read_role, fault_role}),
        Expect("page", "BlockStackMergeCollapse", fault_role),
    )
    with r.fio(_seq_read(lab.devices[read_role]), "seq"):
        r.say(f"healthy: batched sequential reads on {lab.name(read_role)} for {r.t.warmup:.0f} s")
        r.watch(r.t.warmup, roles)
        with lab.setting(fault_role, attr, value):
            check = r.observe(scenario, phase, expect, time.time(), roles)
        r.resolved(check, expect, time.time())
    return [check]


def merge_collapse_nomerges(r):
    """Sequential batched 4 KiB direct reads on the single device; nomerges 0 -> 2 -> 0.
    Expected: the collapse page on that device, merging refused (eBPF; diskstats alone cannot tell
    it from random 4 KiB I/O), resolved after nomerges goes back to 0."""
    return _collapse(
        r, "merge-collapse-nomerges", "nomerges=2", "single", "single", "queue/nomerges", "2"
    )


def stack_split(r):
    """Sequential batched reads on the upper of the stacked pair; the lower's max_sectors_kb
    1280 -> 4 -> back. Expected: the layered collapse page naming the lower device."""
    return _collapse(
        r, "stack-split", "lower max_sectors_kb=4", "upper", "lower", "queue/max_sectors_kb", "4"
    )


def random_4k(r):
    """Random 4 KiB direct reads and writes (8 sectors per request by nature) on the single device
    and on a file in the ext4 on the stacked pair. Must not page."""
    lab, roles = r.lab, ["single", "upper", "lower"]
    rw = ["--rw=randrw", "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=16"]
    with (
        r.fio([*rw, f"--filename={lab.devices['single']}"], "rand-dev"),
        r.fio([*rw, f"--directory={lab.mounts['upper']}", "--size=64m"], "rand-file"),
    ):
        onset = time.time()
        r.say(
            f"random 4 KiB reads and writes on {lab.name('single')} and in the ext4 on {lab.name('upper')}"
        )
        return [r.observe("random-4k", "randrw 4k", Expect("none"), onset, roles)]


def nomerges_1(r):
    """nomerges=1 (simple one-hit merges only) on the single device and on the stacked pair's
    lower, under batched sequential reads. Merging still happens. Must not page."""
    lab, roles = r.lab, ["single", "upper", "lower"]
    with (
        lab.setting("single", "queue/nomerges", "1"),
        lab.setting("lower", "queue/nomerges", "1"),
        r.fio(_seq_read(lab.devices["single"]), "seq-single"),
        r.fio(_seq_read(lab.devices["upper"]), "seq-upper"),
    ):
        onset = time.time()
        return [r.observe("nomerges-1", "nomerges=1", Expect("none"), onset, roles)]


def trickle(r):
    """A few small I/Os per second (5 random 4 KiB reads and 5 writes) on the single device and in
    the ext4. Small requests, but far too few to matter. Must not page."""
    lab, roles = r.lab, ["single", "upper", "lower"]
    rw = ["--rw=randrw", "--bs=4k", "--direct=1", "--ioengine=psync", "--rate_iops=5,5"]
    with (
        r.fio([*rw, f"--filename={lab.devices['single']}"], "trickle-dev"),
        r.fio([*rw, f"--directory={lab.mounts['upper']}", "--size=16m"], "trickle-file"),
    ):
        onset = time.time()
        return [r.observe("trickle", "5+5 IOPS", Expect("none"), onset, roles)]


# The ext4 incident's workload: many tasks doing 16 KiB random buffered writes, each followed by
# fdatasync, on a filesystem mounted data=journal (every write goes through the journal, so a
# small journal fills quickly) whose journal is too small for them. Measured here (2 cores, the
# stacked pair on the root disk, 20 s): 4 MiB journal, 64 writers 0.14-0.17 ms average credit
# wait (1.9 ms on a busy machine), 128 writers 0.67 ms (p99 <= 16 ms); 1 GiB journal 0.03-0.05 ms
# (p99 <= 2 ms) with either. 128 writers keep the small journal well above the alert's 0.5 ms.
JOURNAL_WRITERS = 128
JOURNAL_FIO = [
    "--rw=randwrite",
    "--bs=16k",
    "--ioengine=psync",
    "--fdatasync=1",
    "--buffered=1",
    f"--numjobs={JOURNAL_WRITERS}",
    "--size=4m",
    "--group_reporting",
]
JOURNAL_PHASES = (
    # (phase, role, journal MiB, mount options, expectation)
    (
        "4 MiB journal",
        "jsmall",
        4,
        "data=journal",
        Expect("alert", "BlockStackJbd2CreditWaitHigh", "jsmall"),
    ),
    ("1 GiB journal", "jlarge", 1024, "data=journal", Expect("none", nothing="no alert")),
)


def journal_starvation(r):
    """fsync-heavy random buffered writes (16 KiB, fdatasync) from 128 jobs on an ext4 with a 4 MiB
    journal, then on one with a 1 GiB journal (the ext4 incident's third fix), each mounted
    data=journal on a stacked pair on the root disk. Expected: the jbd2 credit-wait warning
    (ticket) on the first only."""
    checks = []
    for phase, role, journal_mib, options, expect in JOURNAL_PHASES:
        with r.lab.journal_fs(role, journal_mib, options) as mnt:
            r.say(
                f"{phase}: {JOURNAL_WRITERS} writers, 16 KiB randwrite + fdatasync, on {r.lab.name(role)} ({options})"
            )
            with r.fio([*JOURNAL_FIO, f"--directory={mnt}"], role):
                onset = time.time()
                saved, r.t.quiet = r.t.quiet, r.t.journal_quiet
                try:
                    check = r.observe(
                        "journal-starvation", phase, expect, onset, [role, f"{role}-lower"]
                    )
                finally:
                    r.t.quiet = saved
                if r.view is not None:
                    wait = r.view.jbd2_wait(r.lab.name(role))
                    if wait is not None:
                        check.observed += f" (credit wait {wait * 1e3:.2f} ms avg)"
                        r.say(f"{phase}: average credit wait {wait * 1e3:.3f} ms")
                checks.append(check)
        r.settle()
    return checks


SCENARIOS = {
    "merge-collapse-nomerges": merge_collapse_nomerges,
    "stack-split": stack_split,
    "random-4k": random_4k,
    "nomerges-1": nomerges_1,
    "trickle": trickle,
    "journal-starvation": journal_starvation,
}


def describe(name):
    return " ".join(SCENARIOS[name].__doc__.split())
