"""One scrape: the collectors run in turn, each isolated from the others' failures.

Each collector is an object with a `name` and a `collect(scrape)` generator of metric families.
Problems with one device or one file are reported with `scrape.error(...)`: they count in
blockstack_collector_errors_total and are logged, and the collector carries on. An exception
that escapes a collector marks only that collector failed
(blockstack_scrape_collector_success 0); the rest of the scrape is served.
"""
import contextlib
import logging
import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from . import devices
from .fs import AttributeReader, ParseError, read_text

log = logging.getLogger("blockstack_exporter")


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
    is most of a scrape at 1024 devices, and the server keeps the text of an unchanged family)."""

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


class Scrape:
    """What one scrape has read so far, shared by its collectors so no file is read twice."""

    def __init__(self, paths, errors, attributes):
        self.paths = paths
        self.attributes = attributes  # AttributeReader: sysfs attributes through kept descriptors
        self._errors = errors
        self.collector = None
        self._devices = None
        self._mounts = None
        self._dm = None
        self._backing = {}
        self._recording = None

    def error(self, message):
        self._errors[self.collector] = self._errors.get(self.collector, 0) + 1
        log.warning("collector %s: %s", self.collector, message)
        if self._recording is not None:
            self._recording.append((message,))

    @contextlib.contextmanager
    def recording(self):
        """The arguments of every error() call made inside the block."""
        self._recording = []
        try:
            yield self._recording
        finally:
            self._recording = None

    @property
    def devices(self):
        if self._devices is None:
            self._devices = devices.list_devices(self.paths.sysfs)
        return self._devices

    @property
    def mounts(self):
        """Mounts from mountinfo; [] (and one error) if it cannot be read."""
        if self._mounts is None:
            try:
                self._mounts = devices.read_mountinfo(self.paths.procfs)
            except (OSError, ParseError) as e:
                self.error(f"mountinfo: {e}")
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
                        self._dm[name] = (self.attributes.read_text(f"{dev.path}/dm/name"),
                                          self.attributes.read_text(f"{dev.path}/dm/uuid"))
                    except FileNotFoundError:
                        pass  # vanished between listing and reading
                    except OSError as e:
                        self.error(f"{name}: dm name/uuid: {e}")
        return self._dm

    def backing_file(self, dev):
        """A loop device's backing file, read once per scrape ('' when unattached: no loop/
        directory). Raises OSError as read_text does."""
        if dev.name not in self._backing:
            try:
                self._backing[dev.name] = read_text(f"{dev.path}/loop/backing_file")
            except FileNotFoundError:
                self._backing[dev.name] = ""
            except OSError as e:
                self._backing[dev.name] = e
        value = self._backing[dev.name]
        if isinstance(value, OSError):
            raise value
        return value

    def identity(self, dev):
        """What makes a device the same device from one scrape to the next: its device number,
        and for a dm device its uuid, for a loop device its backing file (a loop device keeps
        its number when detached and attached to another file). None if it cannot be told."""
        try:
            devt = self.attributes.read_text(f"{dev.path}/dev")
            if dev.name.startswith("dm-"):
                return devt, self.dm.get(dev.name, ("", None))[1]
            if dev.name.startswith("loop"):
                return devt, self.backing_file(dev)
            return devt, None
        except OSError:
            return None


class BlockstackCollector(Collector):
    def __init__(self, collectors, paths):
        self.collectors = collectors
        self.paths = paths
        self.errors = {c.name: 0 for c in collectors}
        self.attributes = AttributeReader()
        self.lock = threading.Lock()  # concurrent scrapes take turns: shared descriptors and counters

    def collect(self):
        with self.lock:
            families = list(self._collect())
            self.attributes.sweep()
        return families

    def _collect(self):
        scrape = Scrape(self.paths, self.errors, self.attributes)
        success = GaugeMetricFamily(
            "blockstack_scrape_collector_success",
            "Whether the collector's last scrape succeeded (1) or failed as a whole (0).",
            labels=["collector"])
        duration = GaugeMetricFamily(
            "blockstack_scrape_collector_duration_seconds",
            "How long the collector's last scrape took.", labels=["collector"])
        for c in self.collectors:
            scrape.collector = c.name
            start = time.perf_counter()
            try:
                families = list(c.collect(scrape))
                ok = 1
            except Exception as e:  # one collector's failure must never fail the scrape
                scrape.error(f"failed: {e!r}")
                families, ok = [], 0
            duration.add_metric([c.name], time.perf_counter() - start)
            success.add_metric([c.name], ok)
            yield from families
        errors = CounterMetricFamily(
            "blockstack_collector_errors",
            "Problems met while reading kernel interfaces (bad values, vanished devices, "
            "failed commands), by collector; each is also logged.", labels=["collector"])
        for name, n in self.errors.items():
            errors.add_metric([name], n)
        yield success
        yield duration
        yield errors
