"""The findings of the table of checks (checks.py), as blockstack_finding{device, check, severity}.

Reads nothing itself: it runs last and judges what the other collectors read in this scrape, as
they parsed it (Scrape.host: checks.Host), so it costs no second walk of sysfs. The findings are
built again only when that changed (Reuse). `blockstack-doctor` evaluates the same table on the
same Host.
"""

from prometheus_client.core import GaugeMetricFamily

from .. import checks
from ..scrape import Reuse


class FindingsCollector:
    name = "findings"

    def __init__(self, knobs):
        self.knobs = knobs
        self.last = []  # the findings of the last scrape, for the doctor
        self.host = None
        # worth 9 % of a 1024-device scrape's CPU (make bench-exporter --without reuse-findings)
        self._reuse = Reuse()

    def collect(self, scrape):
        self.host = scrape.host
        # Parts the collectors reused are the very objects of the last scrape: the tuple
        # comparison finds them equal by identity; others are compared value by value.
        key = tuple(getattr(self.host, part) for part in checks.Host.PARTS)
        return self._reuse.families_for(scrape, key, lambda: self._build(scrape))

    def _build(self, scrape):
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
