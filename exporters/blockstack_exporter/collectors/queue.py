"""Queue settings from /sys/block/DEV/queue/ (Documentation/ABI/stable/sysfs-block).

Settings re-read on every scrape: nomerges, max_sectors_kb, the scheduler, read_ahead_kb and
nr_requests are writable at run time (the NVMe incident was a nomerges=2 nobody knew about), and
rotational is too. The device's limits (logical and physical block size, max_hw_sectors_kb,
max_segments) are the driver's and do not change while the device exists: they are read when a
device is first seen, and again whenever its identity (Scrape.identity: device number, dm uuid,
loop backing file) changes.
"""

import os

from prometheus_client.core import GaugeMetricFamily

from ..fs import ParseError, parse_uint
from ..scrape import Reuse, reason_of
from ..settings import QUEUE, SCHEDULER, SETTINGS

# Every file this collector reads in queue/. The fixtures' capture (tests/capture_fixture.py), the
# fuzzer's targets (tests/fuzzing.py) and the benchmark's tree (bench/bench_scrape.py) use this
# list: a new setting is one row of the table (settings.QUEUE).
FILES = tuple(s.file for s in QUEUE)


def parse_scheduler(text):
    """'none [mq-deadline] kyber' -> 'mq-deadline'; 'none' (bio-based devices) -> 'none'."""
    if "[" in text:
        start = text.index("[") + 1
        end = text.find("]", start)
        if end < 0:
            raise ParseError(f"scheduler: unbalanced brackets in {text[:60]!r}")
        return text[start:end]
    words = text.split()
    if len(words) != 1:
        raise ParseError(f"scheduler: no active scheduler in {text[:60]!r}")
    return words[0]


def parse_setting(data, multiplier):
    """A setting's file ('512\\n', the bytes read or text) as a number, times multiplier."""
    digits = data.strip()
    if isinstance(digits, bytes):
        if digits.isdigit() and len(digits) < 20:  # ASCII digits below 2**64: the usual file
            return int(digits) * multiplier
        digits = data.decode("utf-8", "replace").strip()
    return parse_uint(digits) * multiplier


class QueueCollector:
    name = "queue"

    def __init__(self):
        # queue owner -> (identity, {filename: value}) of the settings that never change (read once
        # per identity, see above): worth 11-21 % of a 1024-device scrape's CPU (make
        # bench-exporter --without queue-fixed)
        self._fixed = {}
        # worth 51 % of a 1024-device scrape's CPU (make bench-exporter --without reuse-queue)
        self._reuse = Reuse()
        self._part = {}  # the Host's queue values, of the families built last

    def collect(self, scrape):
        read = {}  # queue owner -> (values, scheduler): a disk's queue is read once for all its partitions
        fixed, self._fixed = self._fixed, {}  # only devices present now are kept
        devices = list(scrape.devices.items())
        for i, (_name, dev) in enumerate(devices):
            if scrape.past_deadline("queues of the remaining devices", len(devices) - i):
                devices = devices[:i]
                break
            if dev.queue_owner not in read:
                read[dev.queue_owner] = self._read_queue(scrape, dev.queue_owner, fixed)
        per_device = tuple((name, *read[dev.queue_owner]) for name, dev in devices)
        families = self._reuse.families_for(scrape, per_device, lambda: self._build(per_device))
        scrape.host.queue = self._part
        return families

    def _build(self, per_device):
        self._part = {}
        for name, values, sched in per_device:
            read = {s.file: v for s, v in zip(SETTINGS, values) if v is not None}
            if sched is not None:
                read[SCHEDULER.file] = sched
            if read:
                self._part[name] = read
        families = [GaugeMetricFamily(s.name, s.help, labels=["device"]) for s in SETTINGS]
        scheduler = GaugeMetricFamily(
            SCHEDULER.name, SCHEDULER.help, labels=["device", SCHEDULER.file]
        )
        for name, values, sched in per_device:
            labels = [name]
            for family, value in zip(families, values):
                if value is not None:
                    family.add_metric(labels, value)
            if sched is not None:
                scheduler.add_metric([name, sched], 1)
        return families + [scheduler]

    def _read_queue(self, scrape, owner, fixed):
        if owner not in scrape.devices:
            scrape.error(f"{owner}: disk of a partition is missing", "vanished")
            return (None,) * len(SETTINGS), None
        dev = scrape.devices[owner]
        queue = f"{dev.path}/queue"
        identity = scrape.identity(dev)
        known_identity, known = fixed.get(owner, (None, {}))
        if identity is None or identity != known_identity:
            known = {}  # a new device behind the name: read everything afresh
        values, sched, kept = self._read(scrape, owner, queue, known)
        if identity is not None:
            self._fixed[owner] = (identity, kept)
        return values, sched

    @staticmethod
    def _read(scrape, owner, queue, known):
        """The values of SETTINGS (None where unreadable), the active scheduler, and the fixed
        settings' values (kept until the device's identity changes); known: those kept so far."""
        read_bytes = scrape.attributes.read_bytes
        kept, values = {}, []
        for setting in SETTINGS:
            filename = setting.file
            value = known.get(filename)  # only fixed settings are known
            if value is None:
                try:
                    value = parse_setting(read_bytes(f"{queue}/{filename}"), setting.scale)
                except FileNotFoundError:
                    if not os.path.isdir(queue):
                        scrape.error(f"{owner}: device vanished while being read", "vanished")
                        return (None,) * len(SETTINGS), None, {}
                    # an older kernel without this file
                except (OSError, ParseError) as e:
                    scrape.error(
                        f"{owner}: {filename}: {e}", reason_of(e), subject=f"{owner} {filename}"
                    )
            if setting.fixed and value is not None:
                kept[filename] = value
            values.append(value)
        try:
            sched = parse_scheduler(scrape.attributes.read_text(f"{queue}/{SCHEDULER.file}"))
        except FileNotFoundError:
            sched = None
        except (OSError, ParseError) as e:
            scrape.error(f"{owner}: scheduler: {e}", reason_of(e), subject=f"{owner} scheduler")
            sched = None
        return tuple(values), sched, kept
