"""One reading of the host for the doctor: the exporter's collectors run once (with a one-off
run's deadline), /proc/diskstats and ebpf_exporter for --interval, lvm.conf's thresholds."""

import logging
import os
import re
import time

from . import collectors
from .collectors import ALL
from .ebpf_counters import read_ebpf
from .fs import ParseError, read_text
from .lineup import Sample
from .scrape import BlockstackCollector, Paths, deadline

log = logging.getLogger("blockstack_exporter")

COLLECTION_SECONDS = 60.0  # a one-off run may take its time (the exporter has a scrape's 4.5 s)
_LVM_SETTING = re.compile(
    r"^\s*(snapshot_autoextend_threshold|thin_pool_autoextend_threshold)\s*=\s*(\d+)",
    re.M | re.ASCII,
)


def parse_lvm_conf(text):
    """The autoextend thresholds set in lvm.conf (comments and unset ones are absent: lvm.conf(5)
    defaults both to 100, off)."""
    return {m[1]: int(m[2]) for m in _LVM_SETTING.finditer(text)}


def parse_diskstats(text):
    """/proc/diskstats (Documentation/admin-guide/iostats.rst) -> {device: (reads, reads merged,
    sectors read, writes, writes merged, sectors written)}."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 10 and all(x.isdigit() for x in f[3:10]):
            out[f[2]] = tuple(int(x) for x in (f[3], f[4], f[5], f[7], f[8], f[9]))
    return out


class Doctor:
    def __init__(self, args, knob_values):
        self.args, self.knobs = args, knob_values
        every = collectors.build(
            ALL, knob_values, dmsetup=args.dmsetup, dm_timeout=args.dmsetup_timeout, dev=args.dev
        )
        self.findings = every[-1]
        self.collector = BlockstackCollector(every, Paths(args.sysfs, args.procfs, args.dev))
        self.messages = []
        self._handler = _Remember(self.messages)
        log.addHandler(self._handler)
        log.propagate = False

    def sample(self, with_rates):
        before = dict(self.collector.errors)
        with deadline(time.monotonic() + COLLECTION_SECONDS):
            families = self.collector.collect()
        failed = [
            s.labels["collector"]
            for f in families
            if f.name == "blockstack_scrape_collector_success"
            for s in f.samples
            if s.value == 0
        ]
        errors = {
            k: v - before.get(k, 0)
            for k, v in self.collector.errors.items()
            if v > before.get(k, 0)
        }
        diskstats = ebpf = None
        if with_rates:
            diskstats = parse_diskstats(read_text(os.path.join(self.args.procfs, "diskstats")))
            if self.args.ebpf:
                numbers = self.findings.host.numbers
                ebpf = read_ebpf(self.args.ebpf, {n[1]: dev for dev, n in numbers.items()})
        return Sample(self.findings.host, errors, failed, diskstats, ebpf, time.monotonic())

    def lvm_conf(self):
        try:
            return parse_lvm_conf(read_text(self.args.lvmconf))
        except FileNotFoundError:
            return {}  # no lvm.conf: LVM's defaults
        except (OSError, ParseError) as e:
            self.messages.append(f"{self.args.lvmconf}: {e}")
            return None


class _Remember(logging.Handler):
    """The collectors' problem reports, kept for the report (once each)."""

    def __init__(self, messages):
        super().__init__(logging.WARNING)
        self.messages = messages

    def emit(self, record):
        text = record.getMessage()
        if text not in self.messages:
            self.messages.append(text)
