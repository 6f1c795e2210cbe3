"""The findings of the table of checks (checks.py), as blockstack_finding{device, check, severity}.

Reads nothing itself: it runs last and judges the families the other collectors yielded in this
scrape (Scrape.families) and what they read without publishing (Scrape.facts: dm-crypt flags),
so it costs no second walk of sysfs. The findings are built again only when those families
changed (Reuse). `blockstack-doctor` evaluates the same table on the same families.
"""

from prometheus_client.core import GaugeMetricFamily

from .. import checks
from ..scrape import Reuse

# The families the checks read (checks._FAMILIES); the reuse key is their samples.
INPUTS = frozenset(checks._FAMILIES)


class FindingsCollector:
    name = "findings"

    def __init__(self, knobs):
        self.knobs = knobs
        self.last = []  # the findings of the last scrape, for the doctor
        self.host = None
        self._reuse = Reuse()

    def collect(self, scrape):
        inputs = [f for f in scrape.families if f.name in INPUTS]
        crypt = scrape.facts.get("crypt_flags", {})
        # Families the collectors reused are the very objects of the last scrape: the tuple
        # comparison finds them equal by identity; others are compared sample by sample.
        key = (tuple(inputs), tuple(sorted((d, tuple(sorted(v))) for d, v in crypt.items())))
        return self._reuse.families_for(scrape, key, lambda: self._build(scrape, inputs))

    def _build(self, scrape, inputs):
        self.host = checks.Host.from_families(inputs, scrape.facts)
        failed = []
        self.last = checks.evaluate(self.host, self.knobs, needs=("scrape",), failed=failed)
        for check, e in failed:
            scrape.error(f"check {check} failed: {e!r}", "failed", subject=f"check {check}")
        g = GaugeMetricFamily(
            "blockstack_finding",
            "A block-stack misconfiguration found on the device (value always 1 while it lasts): check "
            "names it (the table in blockstack_exporter/checks.py, thresholds from alerts/config.yml), "
            "severity is critical, warning or info. `blockstack-doctor` prints each with evidence and fix.",
            labels=["device", "check", "severity"],
        )
        seen = set()
        for f in self.last:
            labels = (f.device, f.check, f.severity)
            if labels not in seen:  # a thin pool with data and metadata nearly full is one series
                seen.add(labels)
                g.add_metric(list(labels), 1)
        return [g]
