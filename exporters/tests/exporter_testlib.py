"""Helpers shared by the exporter's tests (imported by name: conftest modules of several
test directories would shadow each other)."""

import difflib
import os
import shutil
import sys
import time
import urllib.error
import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from blockstack_exporter.main import build_registry, parse_args

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
HOST_LOOP = os.path.join(FIXTURES, "host-loop")
EXPORTER = os.path.join(os.path.dirname(sys.executable), "blockstack-exporter")
FAKE_DMSETUP = os.path.join(HERE, "fake_dmsetup")


def tree_flags(tree):
    """The exporter's flags for a fixture tree; its ebpf-status.tsv (select-configs.sh's status
    file, where the tree has one) for the ebpf collector."""
    status = os.path.join(tree, "ebpf-status.tsv")
    return [
        f"--path.sysfs={tree}/sys",
        f"--path.procfs={tree}/proc",
        f"--path.dev={tree}/dev",
        f"--collector.dm.dmsetup={FAKE_DMSETUP}",
        *([f"--collector.ebpf.status-file={status}"] if os.path.exists(status) else []),
    ]


def registry_for(tree, *flags):
    """The exporter's own registry (main.build_registry) over a fixture tree, with more of its
    command-line flags (e.g. "--no-collector.dm")."""
    return build_registry(parse_args([*tree_flags(tree), *flags]))


class Scraped:
    """One exposition parsed with prometheus_client's parser, queried like get_sample_value.
    Built from the text an exporter served or from a registry (collected once: each
    collection counts errors again)."""

    def __init__(self, source):
        self.text = source if isinstance(source, str) else generate_latest(source).decode()
        self.families = list(text_string_to_metric_families(self.text))
        self.samples = {
            (s.name, frozenset(s.labels.items())): s.value for f in self.families for s in f.samples
        }

    def get(self, metric, /, **labels):
        return self.samples.get((metric, frozenset((k, str(v)) for k, v in labels.items())))

    def series(self, metric):
        """[labels] of every series of a metric."""
        return [dict(labels) for name, labels in self.samples if name == metric]

    def success(self, collector):
        return self.get("blockstack_scrape_collector_success", collector=collector)

    def errors(self, collector=None, reason=None):
        """blockstack_collector_errors_total, over every collector and reason or for one."""
        return sum(
            v
            for (name, labels), v in self.samples.items()
            if name == "blockstack_collector_errors_total"
            and (collector is None or ("collector", collector) in labels)
            and (reason is None or ("reason", reason) in labels)
        )


# --- a tree with every kind of file the exporter reads, dm devices and dmsetup included ------------

# dm-N: (dev, dm name, devices beneath); majors 252 (the fixture's zram0 holds 253:0)
DM_DEVICES = {
    "dm-0": ("252:0", "vg-lv-real", ["loop0"]),
    "dm-1": ("252:1", "vg-snap-cow", ["loop0"]),
    "dm-2": ("252:2", "vg-lv", ["dm-0"]),
    "dm-3": ("252:3", "vg-snap", ["dm-0", "dm-1"]),
}
DMSETUP_TABLE = (
    "vg-lv-real: 0 2048 linear 7:0 0\nvg-snap-cow: 0 1024 linear 7:0 2048\n"
    "vg-lv: 0 2048 snapshot-origin 252:0\nvg-snap: 0 2048 snapshot 252:0 252:1 P 8\n"
)
DMSETUP_STATUS = (
    "vg-lv-real: 0 2048 linear \nvg-snap-cow: 0 1024 linear \n"
    "vg-lv: 0 2048 snapshot-origin \nvg-snap: 0 2048 snapshot 16/1024 16\n"
)


def full_tree(base):
    """host-loop plus four dm devices (an LVM snapshot stack on loop0) and the dmsetup outputs
    fake_dmsetup prints for them. Returns (tree, dmsetup fixture directory)."""
    tree = os.path.join(base, "tree")
    shutil.copytree(HOST_LOOP, tree, symlinks=True)
    for name, (devno, dm_name, slaves) in DM_DEVICES.items():
        rel = f"devices/virtual/block/{name}"
        d = os.path.join(tree, "sys", rel)
        shutil.copytree(
            os.path.join(tree, "sys/devices/virtual/block/loop0/queue"), os.path.join(d, "queue")
        )
        os.makedirs(os.path.join(d, "dm"))
        os.makedirs(os.path.join(d, "slaves"))
        for path, text in (("dev", devno), ("dm/name", dm_name), ("dm/uuid", f"LVM-{name}fixture")):
            with open(os.path.join(d, path), "w") as f:
                f.write(text + "\n")
        for low in slaves:
            os.symlink(f"../../{low}", os.path.join(d, "slaves", low))
        os.symlink(f"../../{rel}", os.path.join(tree, "sys/class/block", name))
        os.symlink(f"../../{rel}", os.path.join(tree, "sys/dev/block", devno))
    fixtures = os.path.join(base, "dmsetup")
    os.makedirs(fixtures)
    for command, text in (
        ("dmsetup_table", DMSETUP_TABLE),
        ("dmsetup_status_--noflush", DMSETUP_STATUS),
    ):
        with open(os.path.join(fixtures, command), "w") as f:
            f.write(text)
    return tree, fixtures


def exporter_argv(tree, port, *extra):
    return [EXPORTER, f"--web.listen-address=127.0.0.1:{port}", *tree_flags(tree), *extra]


def http(url, method="GET", headers=None, timeout=30):
    """(status, body text, seconds) of one request, whatever the status."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace"), time.monotonic() - start
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace"), time.monotonic() - start


def assert_golden(request, path, body, what):
    """body is the golden file at path, or is written there with --update-golden (make
    update-fixtures); what names body in the diff."""
    if request.config.getoption("--update-golden"):
        with open(path, "w") as f:
            f.write(body)
    with open(path) as f:
        expected = f.read()
    name = os.path.basename(path)
    diff = "".join(
        difflib.unified_diff(expected.splitlines(True), body.splitlines(True), name, what)
    )
    assert not diff, f"{what} differs from {name} (make update-fixtures if intended):\n" + diff
