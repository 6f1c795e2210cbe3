"""One scrape: the collectors run in turn, each isolated from the others' failures.

Each collector is an object with a `name` and a `collect(scrape)` generator of metric families.
Problems with one device or one file are reported with `scrape.error(...)`: they count in
blockstack_collector_errors_total and are logged, and the collector carries on. An exception
that escapes a collector marks only that collector failed
(blockstack_scrape_collector_success 0); the rest of the scrape is served.
"""
import logging
import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from . import devices
from .fs import AttributeReader, ParseError

log = logging.getLogger("blockstack_exporter")


def add_gauge_sample(family, labels, value):
    """GaugeMetricFamily.add_metric with the labels as a dict {label: value}, which the caller may
    share between families (one device's {"device": name} for its ten queue settings). add_metric
    zips a new dict for every sample: three times as slow, at 20k samples a scrape for 1024 devices."""
    family.samples.append(Sample(family.name, labels, value))


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

    def error(self, message):
        self._errors[self.collector] = self._errors.get(self.collector, 0) + 1
        log.warning("collector %s: %s", self.collector, message)

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
