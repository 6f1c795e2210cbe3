"""Helpers shared by the exporter's tests (imported by name: conftest modules of several
test directories would shadow each other)."""
import os
import sys

from prometheus_client import CollectorRegistry

from blockstack_exporter.collectors import ALL
from blockstack_exporter.scrape import BlockstackCollector, Paths

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
HOST_LOOP = os.path.join(FIXTURES, "host-loop")
EXPORTER = os.path.join(os.path.dirname(sys.executable), "blockstack-exporter")


def tree_paths(root):
    return Paths(sysfs=os.path.join(root, "sys"), procfs=os.path.join(root, "proc"), dev=os.path.join(root, "dev"))


def registry_for(root, collectors=None):
    """A fresh registry with the given collectors (all by default) over a fixture tree."""
    names = collectors or list(ALL)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BlockstackCollector([ALL[n]() for n in names], tree_paths(root)))
    return registry


class Scraped:
    """One collection of a registry, queried like get_sample_value (which would collect again
    and so count errors again)."""

    def __init__(self, registry):
        self.samples = {}
        for family in registry.collect():
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def get(self, name, **labels):
        return self.samples.get((name, frozenset(labels.items())))

    def errors(self, collector, reason=None):
        """blockstack_collector_errors_total of a collector, over every reason or for one."""
        return sum(v for (name, labels), v in self.samples.items()
                   if name == "blockstack_collector_errors_total" and ("collector", collector) in labels
                   and (reason is None or ("reason", reason) in labels))


def scrape_tree(root, collectors=None):
    return Scraped(registry_for(root, collectors))
