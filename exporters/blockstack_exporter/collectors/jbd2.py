"""jbd2 journal statistics from /proc/fs/jbd2/DEV-INO/info (fs/jbd2/journal.c jbd2_seq_info_show).

The file reads, on a journal that has committed at least one transaction:

    2313 transactions (2306 requested), each up to 8192 blocks
    average:
      0ms waiting for transaction
      0ms request delay
      4780ms running transaction
      0ms transaction was being locked
      0ms flushing data (in ordered mode)
      0ms logging transaction
      11798us average transaction commit time
      30 handles per transaction
      4 blocks per transaction
      5 logged blocks per transaction

and only its first line before that. Averages are over the transactions since mount.
"""

import os
import re

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..fs import ParseError, listdir, parse_uint, read_text
from ..scrape import Reuse, reason_of

HEAD = re.compile(r"^(\d+) transactions \((\d+) requested\), each up to (\d+) blocks$", re.ASCII)
PHASES = (  # line text after the number -> phase label
    ("waiting for transaction", "waiting"),
    ("request delay", "request_delay"),
    ("running transaction", "running"),
    ("transaction was being locked", "locked"),
    ("flushing data (in ordered mode)", "flushing"),
    ("logging transaction", "logging"),
)
UNITS = {"ms": 1e3, "us": 1e6}  # divisors to seconds
VALUE = re.compile(r"^(\d+)(ms|us)? (.+)$", re.ASCII)


def parse_info(text):
    """-> dict with transactions, requested, max_blocks, phases {label: seconds}, commit_seconds,
    handles, blocks, logged_blocks (the averages absent until the first transaction)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ParseError("jbd2 info: empty")
    m = HEAD.match(lines[0])
    if not m:
        raise ParseError(f"jbd2 info: unexpected first line {lines[0][:80]!r}")
    out = {
        "transactions": parse_uint(m[1], "transactions"),
        "requested": parse_uint(m[2], "requested"),
        "max_blocks": parse_uint(m[3], "max blocks"),
        "phases": {},
    }
    phase_of = dict(PHASES)
    out[
        "bad_lines"
    ] = []  # lines after the first that could not be read: each costs its value alone
    for line in lines[1:]:
        if line == "average:":
            continue
        v = VALUE.match(line)
        try:
            if not v:
                raise ParseError(f"jbd2 info: unexpected line {line[:80]!r}")
            number, unit, what = parse_uint(v[1], what=v[3][:40]), v[2], v[3]
        except ParseError as e:
            out["bad_lines"].append(e)
            continue
        if what in phase_of and unit:
            out["phases"][phase_of[what]] = number / UNITS[unit]
        elif what == "average transaction commit time" and unit:
            out["commit_seconds"] = number / UNITS[unit]
        elif what == "handles per transaction":
            out["handles"] = number
        elif what == "blocks per transaction":
            out["blocks"] = number
        elif what == "logged blocks per transaction":
            out["logged_blocks"] = number
        # an unknown line from a newer kernel is ignored rather than failing the journal
    return out


class Jbd2Collector:
    name = "jbd2"

    def __init__(self):
        # the families, built again only when a journal's info changed: worth 12 % of a 1024-device
        # scrape's CPU, 23 % with ext4's (make bench-exporter --without reuse-ext4+reuse-jbd2)
        self._reuse = Reuse()
        self._part = {}  # the Host's jbd2 part, of the families built last

    def collect(self, scrape):
        jbd2_dir = os.path.join(scrape.paths.procfs, "fs", "jbd2")
        try:
            names = sorted(listdir(jbd2_dir))
        except OSError as e:
            scrape.error(f"{jbd2_dir}: {e}", reason_of(e), subject="jbd2 dir")
            names = []
        read = []  # (journal, info text)
        for i, journal in enumerate(names):
            if scrape.past_deadline("the remaining journals", len(names) - i):
                break
            try:
                read.append((journal, read_text(os.path.join(jbd2_dir, journal, "info"))))
            except FileNotFoundError:
                continue  # unmounted between listing and reading
            except (OSError, ParseError) as e:
                scrape.error(f"{journal}: {e}", reason_of(e), subject=f"{journal} info")
        read = tuple(read)
        families = self._reuse.families_for(scrape, read, lambda: self._build(scrape, read))
        scrape.host.jbd2 = self._part
        return families

    def _build(self, scrape, read):
        self._part = {}
        labels = ["device", "journal"]
        transactions = CounterMetricFamily(
            "blockstack_jbd2_transactions", "Transactions committed since mount.", labels=labels
        )
        requested = CounterMetricFamily(
            "blockstack_jbd2_transactions_requested",
            "Transactions whose commit was requested (fsync and friends) since mount.",
            labels=labels,
        )
        max_blocks = GaugeMetricFamily(
            "blockstack_jbd2_transaction_max_blocks",
            "Most journal blocks one transaction may use; a small journal means a small limit and "
            "handles waiting for credits.",
            labels=labels,
        )
        phases = GaugeMetricFamily(
            "blockstack_jbd2_transaction_phase_average_seconds",
            "Average time a transaction spent in each phase since mount: waiting (for the previous "
            "transaction), request_delay, running, locked, flushing (ordered data), logging.",
            labels=labels + ["phase"],
        )
        commit = GaugeMetricFamily(
            "blockstack_jbd2_commit_average_seconds",
            "Average transaction commit time since mount.",
            labels=labels,
        )
        handles = GaugeMetricFamily(
            "blockstack_jbd2_handles_per_transaction",
            "Average handles per transaction.",
            labels=labels,
        )
        blocks = GaugeMetricFamily(
            "blockstack_jbd2_blocks_per_transaction",
            "Average blocks per transaction.",
            labels=labels,
        )
        logged = GaugeMetricFamily(
            "blockstack_jbd2_logged_blocks_per_transaction",
            "Average logged blocks per transaction.",
            labels=labels,
        )
        for journal, text in read:
            device = journal.rpartition("-")[0] or journal
            lv = [device, journal]
            try:
                info = parse_info(text)
            except ParseError as e:
                scrape.error(f"{journal}: {e}", reason_of(e), subject=f"{journal} info")
                continue
            for e in info["bad_lines"][:1]:
                scrape.error(
                    f"{journal}: {len(info['bad_lines'])} unreadable lines, first: {e}",
                    subject=f"{journal} lines",
                    count=len(info["bad_lines"]),
                )
            transactions.add_metric(lv, info["transactions"])
            j = self._part.setdefault(device, {"journal": journal, "phases": {}})
            j["transactions"] = info["transactions"]
            j["phases"].update(info["phases"])
            requested.add_metric(lv, info["requested"])
            max_blocks.add_metric(lv, info["max_blocks"])
            for phase, seconds in info["phases"].items():
                phases.add_metric(lv + [phase], seconds)
            for family, key in (
                (commit, "commit_seconds"),
                (handles, "handles"),
                (blocks, "blocks"),
                (logged, "logged_blocks"),
            ):
                if key in info:
                    family.add_metric(lv, info[key])
        return transactions, requested, max_blocks, phases, commit, handles, blocks, logged
