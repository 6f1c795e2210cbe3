#!/usr/bin/env python3
"""blockstack-exporter with one of its caches taken out, for `bench_scrape.py --without CACHE`.

    without_cache.py CACHE[+CACHE...] [blockstack-exporter flags...]

Each entry of CACHES patches the exporter's code in this process only, so that the cache never
answers and the work it saves is done on every scrape; the exporter then runs as usual. The
exporter itself has no such switch: this file is the benchmark's.
"""

import sys

from blockstack_exporter import fs, scrape, server
from blockstack_exporter.collectors import ALL, dm, queue
from blockstack_exporter.main import main


class _Build:
    """A Reuse that builds the families on every scrape."""

    def families_for(self, scrape, key, build):
        return list(build())


def _without_reuse(*classes):
    def patch():
        for cls in classes:
            init = cls.__init__

            def __init__(self, *args, init=init, **kwargs):
                init(self, *args, **kwargs)
                self._reuse = _Build()

            cls.__init__ = __init__

    return patch


def _without_attribute_descriptors():
    init = fs.AttributeReader.__init__

    def __init__(self):
        init(self)
        self.capacity = 0  # every read opens and closes its file

    fs.AttributeReader.__init__ = __init__


def _without_family_text():
    def render(self, families, encoder, content_type):
        return encoder(server._Families(families))

    server.FamilyTextCache.render = render


def _without_checked_once():
    check = scrape.BlockstackCollector._check

    def checked_again(scrape, family):
        family.__dict__.pop("_blockstack_dropped", None)
        return check(scrape, family)

    scrape.BlockstackCollector._check = staticmethod(checked_again)


def _without_queue_fixed():
    collect = queue.QueueCollector.collect

    def collect_reading_all(self, scrape):
        self._fixed = {}  # every queue file read on every scrape
        return collect(self, scrape)

    queue.QueueCollector.collect = collect_reading_all


def _without_devt_once():
    def devt(self, dev):
        devt = self.attributes.read_text(f"{dev.path}/dev")  # again by each collector asking
        self._devts[dev.name] = devt
        return devt

    scrape.Scrape.devt = devt


def _without_dm_table():
    # `dmsetup table` every scrape, and no status begun before it (DmCollector.begin)
    dm.KeptTable.current = lambda self, events: False


# name -> (where the cache is, the patch that takes it out)
REUSERS = {name: cls for name, cls in ALL.items() if name != "ebpf"}
CACHES = {
    "reuse": ("scrape.py Reuse, in every collector", _without_reuse(*REUSERS.values())),
    **{
        f"reuse-{name}": (f"collectors/{name}.py Reuse (scrape.py)", _without_reuse(cls))
        for name, cls in REUSERS.items()
    },
    "queue-fixed": ("collectors/queue.py _fixed, Scrape.identity", _without_queue_fixed),
    "family-text": ("server.py FamilyTextCache", _without_family_text),
    "checked-once": ("scrape.py _check's _blockstack_dropped", _without_checked_once),
    "descriptors": ("fs.py AttributeReader kept descriptors", _without_attribute_descriptors),
    "devt-once": ("scrape.py Scrape._devts, for one scrape", _without_devt_once),
    "dm-table": ("collectors/dm.py KeptTable, between device-mapper events", _without_dm_table),
}


if __name__ == "__main__":
    names = sys.argv[1].split("+") if len(sys.argv) > 1 else []
    if not names or not set(names) <= set(CACHES):
        sys.exit(
            f"usage: {sys.argv[0]} CACHE[+CACHE...] [blockstack-exporter flags], CACHE one of "
            + ", ".join(CACHES)
        )
    for name in names:
        CACHES[name][1]()
    sys.argv[0:2] = ["blockstack-exporter"]
    sys.exit(main())
