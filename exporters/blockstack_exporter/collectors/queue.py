"""Queue settings from /sys/block/DEV/queue/ (Documentation/ABI/stable/sysfs-block).

Re-read on every scrape: nomerges, max_sectors_kb, the scheduler and read_ahead_kb are all
writable at run time, and the NVMe incident was a nomerges=2 nobody knew about.
"""
import os

from prometheus_client.core import GaugeMetricFamily

from ..fs import ParseError
from ..scrape import add_gauge_sample

KIB = 1024

# (file in queue/, metric suffix, HELP, multiplier to base units)
SETTINGS = (
    ("nomerges", "nomerges",
     "Request merging: 0 all merges enabled, 1 only simple one-hit merges, 2 no merges.", 1),
    ("max_sectors_kb", "max_sectors_bytes",
     "Largest request the block layer builds for the device (max_sectors_kb), in bytes.", KIB),
    ("max_hw_sectors_kb", "max_hw_sectors_bytes",
     "Largest request the device's driver accepts (max_hw_sectors_kb), in bytes.", KIB),
    ("read_ahead_kb", "read_ahead_bytes", "Read-ahead window, in bytes.", KIB),
    ("nr_requests", "nr_requests", "Requests that may be allocated per queue (per hardware queue for blk-mq).", 1),
    ("rotational", "rotational", "Whether the device is rotational (1) or not (0).", 1),
    ("logical_block_size", "logical_block_size_bytes", "Smallest unit the device can address, in bytes.", 1),
    ("physical_block_size", "physical_block_size_bytes", "Smallest unit the device writes without read-modify-write, in bytes.", 1),
    ("max_segments", "max_segments", "Most scatter/gather segments in one request.", 1),
)


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
    try:
        value = int(text)
    except ValueError:
        raise ParseError(f"expected an integer, got {text[:40]!r}") from None
    if value < 0:
        raise ParseError(f"expected a non-negative integer, got {value}")
    return value * multiplier


class QueueCollector:
    name = "queue"

    def collect(self, scrape):
        families = [GaugeMetricFamily("blockstack_queue_" + suffix, help_, labels=["device"])
                    for _, suffix, help_, _ in SETTINGS]
        scheduler = GaugeMetricFamily(
            "blockstack_queue_scheduler_info",
            "The active I/O scheduler of the device's queue (value always 1).", labels=["device", "scheduler"])
        read = {}  # queue owner -> (values, scheduler): a disk's queue is read once for all its partitions
        for name, dev in scrape.devices.items():
            owner = dev.queue_owner
            if owner not in read:
                read[owner] = self._read_queue(scrape, owner)
            values, sched = read[owner]
            labels = {"device": name}
            for family, value in zip(families, values):
                if value is not None:
                    add_gauge_sample(family, labels, value)
            if sched is not None:
                add_gauge_sample(scheduler, {"device": name, "scheduler": sched}, 1)
        yield from families
        yield scheduler

    def _read_queue(self, scrape, owner):
        if owner not in scrape.devices:
            scrape.error(f"{owner}: disk of a partition is missing")
            return [None] * len(SETTINGS), None
        queue = os.path.join(scrape.devices[owner].path, "queue")
        values = []
        for filename, _, _, multiplier in SETTINGS:
            try:
                values.append(parse_setting(scrape.attributes.read_text(f"{queue}/{filename}"), multiplier))
            except FileNotFoundError:
                if not os.path.isdir(queue):
                    scrape.error(f"{owner}: device vanished while being read")
                    return [None] * len(SETTINGS), None
                values.append(None)  # an older kernel without this file
            except (OSError, ParseError) as e:
                scrape.error(f"{owner}: {filename}: {e}")
                values.append(None)
        try:
            sched = parse_scheduler(scrape.attributes.read_text(f"{queue}/scheduler"))
        except FileNotFoundError:
            sched = None
        except (OSError, ParseError) as e:
            scrape.error(f"{owner}: scheduler: {e}")
            sched = None
        return values, sched
