"""One scrape: the collectors run in turn, each isolated from the others' failures.

Each collector is an object with a `name` and a `collect(scrape)` generator of metric families,
and optionally `begin(scrape)`, called for every such collector before the first turn, to start
what it would otherwise wait for in its turn, and `end()`, called once the scrape is over,
whether it ended or raised, to stop whatever begin() started and collect() did not finish.
Problems with one device or one file are reported with `scrape.error(...)`: they count in
blockstack_collector_errors_total{collector,reason} and are logged, and the collector carries
on. A condition that persists (the same subject, e.g. a device and what was read) is logged
once, again when its reason changes, and once more when it is gone; at most MAX_LOG_LINES
lines a scrape. It is counted on every scrape that meets it, so that rate() of the counter says
the problem is still there (a count of first occurrences would go flat, looking mended). What
the exporter observes about a device (an invalid snapshot, a failed thin pool) is no error: it
is published as state. An exception that escapes a collector marks only that collector failed
(blockstack_scrape_collector_success 0); the rest of the scrape is served.

Every sample a collector yields is checked before it is served: a value the exposition cannot
write (an integer beyond a float's range), a label value that is not printable text (bytes that
were not UTF-8 in a file name) or longer than MAX_LABEL_VALUE, and series beyond
MAX_SERIES_PER_DEVICE for one device in one family each cost that sample alone, and are counted.

Deadlines: a collection has a budget (the request's, see server.py); each collector gets its
SHARES part of it, so their deadlines add up to the budget. A collector past its deadline skips
what is left (counted, reason "deadline"); reads that can block run with the deadline as
timeout (dmsetup, ext4 superblocks).
"""

import contextlib
import logging
import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from . import devices
from .checks import Host
from .fs import AttributeReader, ParseError, TooLarge, read_text

log = logging.getLogger("blockstack_exporter")

MAX_LABEL_VALUE = 512  # characters; a path or a mount option is far shorter
MAX_SERIES_PER_DEVICE = (
    512  # per family; a device has ~30 ext4 options, and beneath it a few devices
)
MAX_LOG_LINES = 20  # new log lines per scrape; the rest is summed up in one line
DEFAULT_TIMEOUT = (
    4.5  # seconds, without a deadline from the request (the stack's scrape timeout is 5 s)
)
SHARES = {
    "queue": 0.15,
    "stack": 0.15,
    "dm": 0.35,
    "ext4": 0.2,
    "jbd2": 0.08,
    "ebpf": 0.02,
    "findings": 0.05,
}  # of a collection's budget


class CollectorFailed(Exception):
    """Raised by a collector that cannot publish anything and has counted why."""


def reason_of(exc):
    """The errors_total reason for an exception met while reading."""
    if isinstance(exc, TooLarge):
        return "too_large"
    if isinstance(exc, ParseError):
        return "parse"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, FileNotFoundError):
        return "vanished"
    return "unreadable"


def printable(text, limit=300):
    """Text safe for one log line: cut, bytes that were not UTF-8 and newlines escaped."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\n", "\\n")


_local = threading.local()


@contextlib.contextmanager
def deadline(when):
    """Collections in this thread should end by `when` (time.monotonic()); see server.py."""
    _local.deadline = when
    try:
        yield
    finally:
        _local.deadline = None


def current_deadline():
    return getattr(_local, "deadline", None)


class Reuse:
    """The families a collector built from what it read, reused while what it read is equal.

    Reading is never skipped; building the same samples again is (prometheus_client's add_metric
    is most of a scrape at 1024 devices, and the server keeps the text of an unchanged family).
    Worth 167 % of a 1024-device scrape's CPU in all collectors (make bench-exporter --without
    reuse); each collector's share is at its Reuse()."""

    def __init__(self):
        self.key = None
        self.families = None
        self.errors = []

    def families_for(self, scrape, key, build):
        """build()'s families for this key, built again only when the key changed. Errors that
        building reported are reported again when its families are reused."""
        if self.families is None or key != self.key:
            self.families = None
            with scrape.recording() as errors:
                families = list(build())
            self.key, self.families, self.errors = key, families, errors
        else:
            for args in self.errors:
                scrape.error(*args)
        return self.families


class Paths:
    """Roots of the kernel interfaces, repointed at fixture trees by tests (like node_exporter)."""

    def __init__(self, sysfs="/sys", procfs="/proc", dev="/dev"):
        self.sysfs, self.procfs, self.dev = sysfs, procfs, dev


def add_path_flags(p):
    """--path.sysfs, --path.procfs, --path.dev on an argparse parser: the roots of Paths."""
    p.add_argument(
        "--path.sysfs", dest="sysfs", default="/sys", help="sysfs mountpoint (default %(default)s)"
    )
    p.add_argument(
        "--path.procfs",
        dest="procfs",
        default="/proc",
        help="procfs mountpoint (default %(default)s)",
    )
    p.add_argument(
        "--path.dev",
        dest="dev",
        default="/dev",
        help="device nodes, read for ext4 superblocks (default %(default)s)",
    )


def add_dm_flags(p, timeout):
    """--collector.dm.dmsetup and --collector.dm.timeout (default: timeout seconds)."""
    p.add_argument(
        "--collector.dm.dmsetup",
        dest="dmsetup",
        default="dmsetup",
        help="dmsetup binary (default %(default)s)",
    )
    p.add_argument(
        "--collector.dm.timeout",
        dest="dmsetup_timeout",
        type=float,
        default=timeout,
        help="seconds before a dmsetup call is abandoned (default %(default)s)",
    )


class Scrape:
    """What one scrape has read so far, shared by its collectors so no file is read twice."""

    def __init__(self, paths, owner):
        self.paths = paths
        self.attributes = (
            owner.attributes
        )  # AttributeReader: sysfs attributes through kept descriptors
        self._owner = owner
        self.collector = None
        self.deadline = None  # monotonic time the current collector should be done by
        self._devices = None
        self._mounts = None
        self._dm = None
        self._backing = {}
        self._devts = {}  # kernel name -> device number, as read from DEV/dev this scrape
        self._recording = None
        # what the collectors read, as they parsed it: each fills its part, the findings judge it
        self.host = Host()

    def error(self, message, reason="parse", subject=None, count=1):
        """Count `count` problems of this kind and log the message, unless the same subject
        (default: the message itself) was logged with the same message in the previous scrape."""
        self._owner.count_error(self.collector, reason, subject or message, message, count)
        if self._recording is not None:
            self._recording.append((message, reason, subject, count))

    @contextlib.contextmanager
    def recording(self):
        """The arguments of every error() call made inside the block."""
        self._recording = []
        try:
            yield self._recording
        finally:
            self._recording = None

    def remaining(self):
        """Seconds left before the current collector's deadline."""
        return self.deadline - time.monotonic()

    def past_deadline(self, what, skipped):
        """True (and `skipped` items counted) once the current collector's deadline has passed."""
        if time.monotonic() < self.deadline:
            return False
        self.error(
            f"deadline reached; {what} skipped",
            reason="deadline",
            subject="deadline",
            count=max(1, skipped),
        )
        return True

    @property
    def devices(self):
        if self._devices is None:
            try:
                self._devices = devices.list_devices(self.paths.sysfs)
            except OSError as e:
                self.error(f"listing block devices: {e}", reason_of(e), subject="class/block")
                self._devices = {}
        return self._devices

    @property
    def mounts(self):
        """Mounts from mountinfo; [] (and one error) if it cannot be read."""
        if self._mounts is None:
            try:
                self._mounts, bad = devices.read_mountinfo(self.paths.procfs)
                if bad:
                    self.error(
                        f"mountinfo: {bad} malformed lines skipped",
                        subject="mountinfo lines",
                        count=bad,
                    )
            except (OSError, ParseError) as e:
                self.error(f"mountinfo: {e}", reason_of(e), subject="mountinfo")
                self._mounts = []
        return self._mounts

    @property
    def dm(self):
        """{dm-N: (dm name, dm uuid)} for every device-mapper device, from sysfs dm/ directories."""
        if self._dm is None:
            self._dm = {}
            for name, dev in self.devices.items():
                if dev.parent is None and name.startswith("dm-"):
                    try:
                        self._dm[name] = (
                            self.attributes.read_text(f"{dev.path}/dm/name"),
                            self.attributes.read_text(f"{dev.path}/dm/uuid"),
                        )
                    except FileNotFoundError:
                        pass  # vanished between listing and reading
                    except (OSError, ParseError) as e:
                        self.error(f"{name}: dm name/uuid: {e}", reason_of(e), subject=f"{name} dm")
        return self._dm

    def backing_file(self, dev):
        """A loop device's backing file, read once per scrape ('' when unattached: no loop/
        directory). Raises OSError or ParseError as read_text does."""
        if dev.name not in self._backing:
            try:
                self._backing[dev.name] = read_text(f"{dev.path}/loop/backing_file")
            except FileNotFoundError:
                self._backing[dev.name] = ""
            except (OSError, ParseError) as e:
                self._backing[dev.name] = e
        value = self._backing[dev.name]
        if isinstance(value, Exception):
            raise value
        return value

    def name_of_devno(self, majmin):
        """'253:3' -> 'dm-3' through /sys/dev/block, or None."""
        return devices.name_of_devno(self.paths.sysfs, majmin)

    def devt(self, dev):
        """The device number as its DEV/dev file gives it ('7:3'), read once per scrape. Raises
        OSError or ParseError as read_text does."""
        if dev.name not in self._devts:
            self._devts[dev.name] = self.attributes.read_text(f"{dev.path}/dev")
        return self._devts[dev.name]

    def identity(self, dev):
        """What makes a device the same device from one scrape to the next: its device number,
        and for a dm device its uuid, for a loop device its backing file (a loop device keeps
        its number when detached and attached to another file). None if it cannot be told."""
        try:
            devt = self.devt(dev)
            if dev.name.startswith("dm-"):
                return devt, self.dm.get(dev.name, ("", None))[1]
            if dev.name.startswith("loop"):
                return devt, self.backing_file(dev)
            return devt, None
        except (OSError, ParseError):
            return None


class BlockstackCollector(Collector):
    def __init__(self, collectors, paths):
        self.collectors = collectors
        self.paths = paths
        self.errors = {}  # (collector, reason) -> count; a series appears with its first count
        self.attributes = AttributeReader()
        self.lock = threading.Lock()  # scrapes take turns: shared descriptors and counters
        self._logged = {}  # (collector, subject) -> (reason, message) of conditions seen last scrape
        self._seen = {}
        self._log_budget = 0
        self._unlogged = 0

    def count_error(self, collector, reason, subject, message, count):
        key = (collector, reason)
        self.errors[key] = self.errors.get(key, 0) + count
        condition = (collector, printable(str(subject), 120))
        message = printable(message)
        # logged when new or of another reason; a message that only counts or times differently
        # is the same condition (a pending read "started 40 s ago", "3 samples dropped")
        before = self._seen.get(condition) or self._logged.get(condition)
        if before is None or before[0] != reason:
            self._log(logging.WARNING, "collector %s: %s", collector, message)
        self._seen[condition] = reason, message

    def _log(self, level, fmt, *args):
        if self._log_budget > 0:
            self._log_budget -= 1
            log.log(level, fmt, *args)
        else:
            self._unlogged += 1

    def collect(self):
        with self.lock:
            self._seen, self._log_budget, self._unlogged = {}, MAX_LOG_LINES, 0
            families = list(self._collect())
            self.attributes.sweep()
            for (collector, subject), (_, message) in self._logged.items():
                if (collector, subject) not in self._seen:
                    self._log(logging.INFO, "collector %s: no longer: %s", collector, message)
            self._logged = self._seen
            if self._unlogged:
                log.warning(
                    "%d more problems or changes not logged this scrape; see "
                    "blockstack_collector_errors_total",
                    self._unlogged,
                )
        return families

    def _collect(self):
        scrape = Scrape(self.paths, self)
        now = time.monotonic()
        overall = current_deadline() or now + DEFAULT_TIMEOUT
        budget = max(0.0, overall - now)
        shares = {c.name: SHARES.get(c.name, 0.1) for c in self.collectors}
        total_share = sum(shares.values()) or 1.0
        success = GaugeMetricFamily(
            "blockstack_scrape_collector_success",
            "Whether the collector's last scrape succeeded (1) or failed as a whole (0).",
            labels=["collector"],
        )
        duration = GaugeMetricFamily(
            "blockstack_scrape_collector_duration_seconds",
            "How long the collector's last scrape took.",
            labels=["collector"],
        )

        def turn(c):
            scrape.collector = c.name
            scrape.deadline = min(overall, time.monotonic() + budget * shares[c.name] / total_share)

        # A collector with begin(scrape) starts there what it would otherwise wait for in its
        # turn (dm: `dmsetup status`, which then runs while queue and stack read sysfs); its
        # end() runs whatever happens, so that nothing begun outlives the scrape. begin() is
        # only a head start: what fails in it is counted, and collect() still runs.
        begun = [c for c in self.collectors if hasattr(c, "begin")]
        spent = {}  # seconds each collector spent in begin(), part of its duration
        try:
            for c in begun:
                turn(c)
                start = time.monotonic()
                try:
                    c.begin(scrape)
                except Exception as e:
                    scrape.error(f"begin failed: {e!r}", reason="failed", subject="begin failed")
                spent[c.name] = time.monotonic() - start
            for c in self.collectors:
                start = time.monotonic()
                turn(c)
                try:
                    families = list(c.collect(scrape))
                    ok = 1
                except CollectorFailed:
                    families, ok = [], 0
                except Exception as e:  # one collector's failure must never fail the scrape
                    scrape.error(f"failed: {e!r}", reason="failed", subject="failed")
                    families, ok = [], 0
                families = [f for f in families if self._check(scrape, f)]
                duration.add_metric([c.name], time.monotonic() - start + spent.get(c.name, 0.0))
                success.add_metric([c.name], ok)
                yield from families
        finally:
            for c in begun:
                c.end()
        errors = CounterMetricFamily(
            "blockstack_collector_errors",
            "Problems met while reading kernel interfaces, by collector and reason: unreadable, "
            "vanished, parse (a bad value), too_large, timeout, deadline, command (dmsetup failed), "
            "label_value, value_range, series_limit (samples dropped), failed (the whole collector). "
            "Counted on every scrape that meets it; logged once while it lasts.",
            labels=["collector", "reason"],
        )
        for (name, reason), n in self.errors.items():
            errors.add_metric([name, reason], n)
        yield success
        yield duration
        yield errors

    @staticmethod
    def _check(scrape, family):
        """Drop the samples the exposition cannot carry (see the module's docstring), counting
        each; True if the family still has something to serve or never had samples. A family
        reused from an earlier scrape (Reuse) is checked once and its drops counted again."""
        # worth 21 % of a 1024-device scrape's CPU (make bench-exporter --without checked-once)
        dropped = getattr(family, "_blockstack_dropped", None)
        if dropped is None:
            dropped = {}
            kept, per_device = [], {}
            for sample in family.samples:
                problem = None
                try:
                    float(sample.value)
                except (OverflowError, TypeError, ValueError):
                    problem = "value_range"
                for value in sample.labels.values():
                    if len(value) > MAX_LABEL_VALUE or not value.isprintable():
                        problem = "label_value"
                device = sample.labels.get("device")
                if problem is None and device is not None:
                    n = per_device[device] = per_device.get(device, 0) + 1
                    if n > MAX_SERIES_PER_DEVICE:
                        problem = "series_limit"
                if problem is None:
                    kept.append(sample)
                else:
                    dropped[problem] = dropped.get(problem, 0) + 1
            if dropped:
                family.samples[:] = kept
            family._blockstack_dropped = dropped
        for reason, n in dropped.items():
            scrape.error(
                f"{family.name}: {n} samples dropped ({reason})",
                reason=reason,
                subject=f"{family.name} {reason}",
                count=n,
            )
        return bool(family.samples) or not dropped
