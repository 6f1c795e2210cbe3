"""Which sets of BPF programs this host's kernel loads, from ebpf-configs/select-configs.sh's status
file (--collector.ebpf.status-file; the stack writes it when it probes the kernel). One line per
set, tab-separated: the set, the config chosen ("-" if none loads), and why each variant before
it did not ("NAME: error; NAME: error"):

    block   block_io_immediate      block_io: libbpf: prog 'flush_pending': BPF program load failed: Invalid argument
    jbd2    jbd2_credit_wait_legacy jbd2_credit_wait_fexit: ...; jbd2_credit_wait: ...

The collapse page rests on the block set alone: where it does not load, nothing can page, and
blockstack_ebpf_set_loaded{set="block"} 0 is what says so (BlockStackCollapseEvidenceMissing).
Without the flag the collector publishes nothing (ebpf_exporter run by other means).
"""

import re

from prometheus_client.core import GaugeMetricFamily

from ..fs import ParseError, read_text
from ..scrape import reason_of

NAME = re.compile(
    r"[a-z0-9_]+", re.ASCII
)  # a set's or a config's name (NAME.yaml in ebpf-configs/)
MAX_ERROR = (
    240  # characters of a variant's error kept as a label (select-configs.sh cuts there too)
)


def parse_status(text):
    """-> [(set, chosen or "", {variant: error})]; ParseError on a line that is not three fields."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) == 2:
            fields.append("")  # no failures: the file's last tab goes with its trailing white space
        if (
            len(fields) != 3
            or not NAME.fullmatch(fields[0])
            or not (fields[1] == "-" or NAME.fullmatch(fields[1]))
        ):
            raise ParseError(
                f"line {number}: expected SET<TAB>CONFIG<TAB>FAILURES, got {line[:80]!r}"
            )
        name, chosen, failures = fields
        errors = {}
        for failure in filter(None, (f.strip() for f in failures.split("; "))):
            variant, _, error = failure.partition(": ")
            errors[variant] = error[:MAX_ERROR]
        rows.append((name, "" if chosen == "-" else chosen, errors))
    return rows


class EbpfCollector:
    name = "ebpf"

    def __init__(self, status_file=None):
        self.status_file = status_file

    def collect(self, scrape):
        if not self.status_file:
            return []
        try:
            rows = parse_status(read_text(self.status_file))
        except (OSError, ParseError) as e:
            scrape.error(f"{self.status_file}: {e}", reason_of(e), subject="ebpf status")
            return []
        loaded = GaugeMetricFamily(
            "blockstack_ebpf_set_loaded",
            "Whether a set of BPF programs loads on this kernel (1) or none of its variants does (0): set "
            "block (block_io, block_io_immediate: the collapse page's evidence), jbd2 (credit waits); config "
            "is the variant ebpf_exporter runs. From ebpf-configs/select-configs.sh at the stack's start.",
            labels=["set", "config"],
        )
        failed = GaugeMetricFamily(
            "blockstack_ebpf_variant_failed_info",
            "A variant of a set of BPF programs that does not load on this kernel, with the loader's error "
            "(value always 1); a later variant of the set may load instead (blockstack_ebpf_set_loaded).",
            labels=["set", "config", "error"],
        )
        for name, chosen, errors in rows:
            loaded.add_metric([name, chosen], 1 if chosen else 0)
            for variant, error in errors.items():
                failed.add_metric([name, variant, error], 1)
        return [loaded, failed]
