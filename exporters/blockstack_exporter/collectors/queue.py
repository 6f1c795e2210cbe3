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
from ..settings import SETTINGS

# Every file this collector reads in queue/. The fixtures' capture (tests/capture_fixture.py), the
# fuzzer's targets (tests/fuzzing.py) and the benchmark's tree (bench/bench_scrape.py) use this
# list: a new setting is one row of SETTINGS.
FILES = tuple(s.file for s in SETTINGS) + ("scheduler",)


# Read on every scrape (writable at run time), and read once per device identity.
CHANGING = tuple(s.file for s in SETTINGS if not s.fixed) + ("scheduler",)
FIXED = tuple(s.file for s in SETTINGS if s.fixed)


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


def parse_setting(text, multiplier):
    return parse_uint(text.strip()) * multiplier


class QueueCollector:
    name = "queue"

    def __init__(self):
        self._fixed = {}  # queue owner -> (identity, {filename: value}) of the settings that never change
        self._parsed = {}  # queue owner -> ((identity, raw bytes read), values, scheduler, errors) of the last scrape
        self._next = {}
        self._reuse = Reuse()

    def collect(self, scrape):
        read = {}  # queue owner -> (values, scheduler): a disk's queue is read once for all its partitions
        fixed, self._fixed = self._fixed, {}  # only devices present now are kept
        self._next = {}
        devices = list(scrape.devices.items())
        for i, (_name, dev) in enumerate(devices):
            if scrape.past_deadline("queues of the remaining devices", len(devices) - i):
                devices = devices[:i]
                break
            if dev.queue_owner not in read:
                read[dev.queue_owner] = self._read_queue(scrape, dev.queue_owner, fixed)
        self._parsed = self._next
        per_device = tuple((name, *read[dev.queue_owner]) for name, dev in devices)
        return self._reuse.families_for(scrape, per_device, lambda: self._build(per_device))

    @staticmethod
    def _build(per_device):
        families = [GaugeMetricFamily(s.name, s.help, labels=["device"]) for s in SETTINGS]
        scheduler = GaugeMetricFamily(
            "blockstack_queue_scheduler_info",
            "The active I/O scheduler of the device's queue (value always 1).",
            labels=["device", "scheduler"],
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
        # The files read on every scrape, raw; what was parsed from the same bytes of the same
        # device last time (values and the errors met) is taken again without parsing.
        raw, failed = {}, False
        read_bytes = scrape.attributes.read_bytes
        for filename in CHANGING:
            try:
                raw[filename] = read_bytes(f"{queue}/{filename}")
            except (OSError, ParseError) as e:
                raw[filename], failed = e, True
        key = None
        if identity is not None and len(known) == len(FIXED) and not failed:
            key = (identity, tuple(raw.values()))
            last = self._parsed.get(owner)
            if last is not None and last[0] == key:
                self._fixed[owner] = (identity, known)
                self._next[owner] = last
                for args in last[3]:
                    scrape.error(*args)
                return last[1], last[2]
        with scrape.recording() as errors:
            values, sched, kept = self._parse(scrape, owner, queue, raw, known)
        if identity is not None:
            self._fixed[owner] = (identity, kept)
        if key is not None:
            self._next[owner] = (key, values, sched, errors)
        return values, sched

    @staticmethod
    def _parse(scrape, owner, queue, raw, known):
        kept = {}
        values = []
        for setting in SETTINGS:
            filename, multiplier, is_fixed = setting.file, setting.scale, setting.fixed
            if is_fixed and filename in known:
                values.append(known[filename])
                kept[filename] = known[filename]
                continue
            try:
                data = (
                    raw[filename]
                    if filename in raw
                    else scrape.attributes.read_bytes(f"{queue}/{filename}")
                )
                if isinstance(data, Exception):
                    raise data
                value = parse_setting(data.decode("utf-8", "replace"), multiplier)
                values.append(value)
                if is_fixed:
                    kept[filename] = value
            except FileNotFoundError:
                if not os.path.isdir(queue):
                    scrape.error(f"{owner}: device vanished while being read", "vanished")
                    return (None,) * len(SETTINGS), None, {}
                values.append(None)  # an older kernel without this file
            except (OSError, ParseError) as e:
                scrape.error(
                    f"{owner}: {filename}: {e}", reason_of(e), subject=f"{owner} {filename}"
                )
                values.append(None)
        try:
            data = raw["scheduler"]
            if isinstance(data, Exception):
                raise data
            sched = parse_scheduler(data.decode("utf-8", "replace").strip())
        except FileNotFoundError:
            sched = None
        except (OSError, ParseError) as e:
            scrape.error(f"{owner}: scheduler: {e}", reason_of(e), subject=f"{owner} scheduler")
            sched = None
        return tuple(values), sched, kept
