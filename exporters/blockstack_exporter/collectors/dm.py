"""device-mapper tables and status (placeholder: being written)."""


class DmCollector:
    name = "dm"

    def __init__(self, dmsetup="dmsetup", timeout=5.0):
        self.dmsetup, self.timeout = dmsetup, timeout

    def collect(self, scrape):
        return iter(())
