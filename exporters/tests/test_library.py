"""The exporter on prometheus_client: its exposition (through the per-family text cache), its
ProcessCollector, node_exporter-style collector flags, and settings that are read once per
device (the limits) or every scrape (everything writable)."""

import os

import pytest
from exporter_testlib import HOST_LOOP, Scraped, registry_for
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import generate_latest as generate_latest_openmetrics

from blockstack_exporter.collectors import ALL
from blockstack_exporter.main import parse_args
from blockstack_exporter.server import FamilyTextCache, _Families

OPENMETRICS = "application/openmetrics-text;version=1.0.0"
LOOP1 = "sys/devices/virtual/block/loop1"


def write(tree, rel, text):
    with open(os.path.join(tree, rel), "w") as f:
        f.write(text)


def test_family_text_cache_writes_what_the_library_writes_scrape_after_scrape():
    cache = FamilyTextCache()
    g = GaugeMetricFamily("a_gauge", 'Help with a "quote".', labels=["device", "path"])
    g.add_metric(["sda", '/srv/"x"\\y\nz'], 1)
    c = CounterMetricFamily("a_counter", "A counter.", labels=["device"])
    c.add_metric(["sda"], 7)
    empty = GaugeMetricFamily("no_samples", "Nothing.", labels=["device"])
    for accept in (None, OPENMETRICS):
        encoder, content_type = choose_encoder(accept)
        library = generate_latest_openmetrics if accept else generate_latest
        for families in ([g, c, empty], [g, c, empty], [c, g], [g]):
            assert cache.render(families, encoder, content_type) == library(_Families(families))
        changed = CounterMetricFamily("a_counter", "A counter.", labels=["device"])
        changed.add_metric(["sda"], 8)
        assert cache.render([g, changed], encoder, content_type) == library(_Families([g, changed]))
    assert cache.hits > 0


def test_collector_flags_as_node_exporter():
    assert parse_args([]).collectors == list(ALL)
    assert parse_args(["--no-collector.dm"]).collectors == [n for n in ALL if n != "dm"]
    assert parse_args(
        ["--collector.disable-defaults", "--collector.queue", "--collector.jbd2"]
    ).collectors == ["queue", "jbd2"]
    with pytest.raises(SystemExit):
        parse_args(["--collectors=queue"])  # the old flag is gone
    with pytest.raises(SystemExit):
        parse_args(["--collector.qu"])  # no abbreviations


def test_process_metrics_of_the_exporter_itself():
    s = Scraped(registry_for(HOST_LOOP, "--no-collector.dm"))
    assert s.get("blockstack_queue_nomerges", device="loop0") == 2
    # the real /proc/self, not the fixture's procfs: this process has descriptors open
    assert s.get("process_open_fds") >= 3
    assert s.get("process_resident_memory_bytes") > 1 << 20


def test_limits_are_read_once_per_device_settings_every_scrape(host_tree):
    """logical_block_size and the other limits are the driver's: read when the device is first
    seen and when its identity (device number, dm uuid, loop backing file) changes; nomerges and
    the other writable settings on every scrape."""
    registry = registry_for(host_tree)
    s = Scraped(registry)
    assert s.get("blockstack_queue_logical_block_size_bytes", device="loop1") == 512
    assert s.get("blockstack_queue_nomerges", device="loop1") == 0

    write(host_tree, f"{LOOP1}/queue/logical_block_size", "4096\n")
    write(host_tree, f"{LOOP1}/queue/max_segments", "7\n")
    write(host_tree, f"{LOOP1}/queue/nomerges", "2\n")
    write(host_tree, f"{LOOP1}/queue/rotational", "1\n")
    s = Scraped(registry)
    assert (
        s.get("blockstack_queue_logical_block_size_bytes", device="loop1") == 512
    )  # not read again
    assert s.get("blockstack_queue_max_segments", device="loop1") != 7
    assert s.get("blockstack_queue_nomerges", device="loop1") == 2  # read again
    assert s.get("blockstack_queue_rotational", device="loop1") == 1

    # loop1 attached to another file: another device behind the same number
    with open(os.path.join(host_tree, f"{LOOP1}/loop/backing_file")) as f:
        backing = f.read()
    write(host_tree, f"{LOOP1}/loop/backing_file", backing.replace(".img", "-2.img"))
    s = Scraped(registry)
    assert s.get("blockstack_queue_logical_block_size_bytes", device="loop1") == 4096
    assert s.get("blockstack_queue_max_segments", device="loop1") == 7

    # and a new device number (removed and made again as another device)
    write(host_tree, f"{LOOP1}/queue/physical_block_size", "8192\n")
    write(host_tree, f"{LOOP1}/dev", "7:99\n")
    assert (
        Scraped(registry).get("blockstack_queue_physical_block_size_bytes", device="loop1") == 8192
    )
