"""End to end: the whole stack (blockstack_deploy.stack.Stack: the three exporters, Prometheus with
alerts/alerts.rules.yml and recording.rules.yml, Alertmanager with alerts/alertmanager.yml, the
page receiver) on loop devices.

Two collapses run at once, each flipped on under batched sequential 4 KiB direct reads
(fio.SEQ_BATCHED_READ) and flipped back:
  layered  loop1 (direct-io) on a file on ext4 on loop0; loop0's max_sectors_kb 1280 -> 4 splits
           loop1's 256-sector requests into 8-sector ones: BlockStackMergeCollapse device=loop0
           stack=loop1 (node_exporter diskstats + the blockstack exporter's stack edges, and
           ebpf_exporter's split counter).
  single   loop2 alone; nomerges 0 -> 2: BlockStackMergeCollapse device=loop2 (ebpf_exporter's
           exact missed-merge counter: merging refused); then max_sectors_kb changes during the
           page and the alert keeps its identity (no resolve, still one alert).
Loop backing files live on tmpfs (/dev/shm), so loop0 and loop2 have no device beneath them, as
a disk would not. Prometheus scrapes and evaluates every 5 s, as in production. Missing
prerequisites fail the test, naming the make target that provides them. Every process and loop
device is removed on exit (also on failure), and the whole run is bounded (about 2.5 minutes).
"""
import contextlib
import os
import pathlib
import shutil
import subprocess
import time

import pytest
from page_receiver import received

from blockstack_deploy import procs
from blockstack_deploy.stack import SERVERS, Stack
from blockstack_lab import fio, loop
from blockstack_lab.api import Alertmanager, Prometheus

pytestmark = [pytest.mark.root, pytest.mark.servers]

PAGE_TIMEOUT = 90      # seconds from the flip; the rules' worst case is 40 s (alerts/README.md)
RESOLVE_TIMEOUT = 190  # rate window 20 s + evaluation + keep_firing_for 90 s + the page route's group_interval 30 s
FIO_RUNTIME = 240      # fio stops by itself even if the test is killed


def missing_prerequisites(stack):
    missing = stack.missing()
    if shutil.which("fio") is None:
        missing.append("fio not found (run make deps)")
    if os.geteuid() != 0:
        missing.append("not root: loop devices, sysfs and BPF need root (sudo make test)")
    return missing


def find_alert(stack, status, **labels):
    """(record, alert) of the first notification holding an alert with these labels and status."""
    return next(((record, alert) for record, alert in received(stack.pages_file) if alert["status"] == status
                 and all(alert["labels"].get(k) == v for k, v in labels.items())), None)


def wait_page(stack, what, device, upper, flipped):
    """The BlockStackMergeCollapse page of device (the stack under `upper`) at the receiver; its
    annotations. Identity: host, device, operation, stack; the settings and the upper are annotations."""
    record, alert = procs.wait_until(f"the {what} page", lambda: find_alert(
        stack, "firing", alertname="BlockStackMergeCollapse", device=device), PAGE_TIMEOUT)
    print(f"{what} collapse paged {record['received_at'] - flipped:.1f}s after the flip")
    assert record["path"] == "/page"
    assert record["notification"]["receiver"] == "page"
    assert record["notification"]["groupLabels"] == {"host": stack.host, "stack": upper}
    assert alert["labels"] == {"alertname": "BlockStackMergeCollapse", "severity": "critical",
                               "host": stack.host, "device": device, "operation": "read", "stack": upper}
    return alert["annotations"]


@pytest.mark.parametrize("servers", list(SERVERS))  # Prometheus 2 / Alertmanager 0.25, and 3 / 0.31
def test_collapse_pages_and_resolves(tmp_path, servers):
    stack = Stack(tmp_path / "stack", servers=servers)
    missing = missing_prerequisites(stack)
    if missing:
        pytest.fail("missing prerequisites:\n  " + "\n  ".join(missing), pytrace=False)
    host = stack.host

    with contextlib.ExitStack() as cleanup:
        # --- the lab: loop0 <- ext4 <- file <- loop1, and loop2 alone, all on tmpfs.
        dev0, dev1, _ = cleanup.enter_context(loop.stacked_pair(768 << 20, 512 << 20, directory="/dev/shm"))
        dev2 = cleanup.enter_context(loop.attached(256 << 20, directory="/dev/shm"))
        name0, name1, name2 = loop.name(dev0), loop.name(dev1), loop.name(dev2)
        for dev in (dev0, dev1, dev2):
            cleanup.enter_context(loop.sysfs_setting(dev, "queue/nomerges", 0))
        # Drop the page cache of what was just written, so loop1's reads reach loop0.
        subprocess.run(["sync"], check=True, timeout=60)
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("1")

        # --- the stack, then healthy load on both.
        cleanup.enter_context(stack.running())
        prometheus, alertmanager = Prometheus(stack.url("prometheus")), Alertmanager(stack.url("alertmanager"))
        prometheus.wait_targets_up()
        for dev in (dev1, dev2):
            cleanup.enter_context(procs.running(
                ["fio", f"--name=itest-{loop.name(dev)}", f"--filename={dev}", "--time_based",
                 f"--runtime={FIO_RUNTIME}", *fio.SEQ_BATCHED_READ],
                log_path=tmp_path / f"fio-{loop.name(dev)}.log"))

        # Healthy baseline: Prometheus sees loop1 and loop0 side by side with large requests
        # (and loop2 merging), and nothing pages.
        def healthy_lineup():
            return prometheus.query('host_device_lower_operation:node_disk_request_size_sectors:lower'
                                    f'{{host="{host}",device="{name1}",lower="{name0}",operation="read"}} > 64') and \
                prometheus.query('host_device_operation:node_disk_request_size_sectors:avg'
                                 f'{{host="{host}",device="{name2}",operation="read"}} > 64')
        procs.wait_until("a healthy lineup of loop1 over loop0 in Prometheus", healthy_lineup, 60)
        assert find_alert(stack, "firing", alertname="BlockStackMergeCollapse") is None

        # --- collapse: split loop0's requests at 4 KiB; forbid merging on loop2.
        with loop.sysfs_setting(dev0, "queue/max_sectors_kb", 4), loop.sysfs_setting(dev2, "queue/nomerges", 2):
            flipped = time.time()

            annotations = wait_page(stack, "layered", name0, name1, flipped)
            assert f"{name0} serves read requests of" in annotations["description"]
            assert "max_sectors_kb=4 " in annotations["description"]
            assert f"Above it {name1} averages" in annotations["description"]
            assert f"/sys/block/{name0}/queue/max_sectors_kb" in annotations["confirm"]
            assert annotations["proves"]
            assert annotations["runbook_url"].endswith("#blockstackmergecollapse")

            annotations = wait_page(stack, "single-device", name2, name2, flipped)
            assert "nomerges=2" in annotations["description"]
            assert annotations["proves"].startswith("Merging refused")
            assert f"echo 0 > /sys/block/{name2}/queue/nomerges" in annotations["confirm"]

            # A setting changed during the page: the same alert goes on (no resolve, one alert).
            changed = time.time()
            with loop.sysfs_setting(dev2, "queue/max_sectors_kb", 512):
                time.sleep(20)
                assert not [a for _, a in received(stack.pages_file, changed)
                            if a["status"] == "resolved" and a["labels"].get("device") == name2]
                firing = prometheus.query(f'ALERTS{{alertname="BlockStackMergeCollapse",alertstate="firing",device="{name2}"}}')
                assert len(firing) == 1, firing

            # One alert per collapsed device and operation in Alertmanager, nothing else paging on
            # the test's devices (the machine's other loop devices are not ours to judge).
            am_alerts = alertmanager.alerts(filter='severity="critical"')
            keys = sorted((a["labels"]["alertname"], a["labels"]["device"], a["labels"]["operation"]) for a in am_alerts
                          if a["labels"].get("device") in (name0, name1, name2))
            assert keys == sorted({("BlockStackMergeCollapse", name0, "read"), ("BlockStackMergeCollapse", name2, "read")}), keys
            # Restored on leaving this block.
        restored = time.time()

        for alertname, device in (("BlockStackMergeCollapse", name0), ("BlockStackMergeCollapse", name2)):
            record, _ = procs.wait_until(f"the {alertname} resolve", lambda: find_alert(
                stack, "resolved", alertname=alertname, device=device), RESOLVE_TIMEOUT)
            print(f"{alertname} on {device} resolved {record['received_at'] - restored:.1f}s after the restore")
            assert record["path"] == "/page"
