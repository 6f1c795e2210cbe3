"""End to end: real exporters on loop devices -> Prometheus with alerts/*.rules.yml ->
Alertmanager with alerts/alertmanager.yml -> the local webhook receiver's file.

Two collapses run at once, each flipped on under batched sequential 4 KiB direct reads
(fio.SEQ_BATCHED_READ) and flipped back:
  layered  loop1 (direct-io) on a file on ext4 on loop0; loop0's max_sectors_kb 1280 -> 4 splits
           loop1's 256-sector requests into 8-sector ones: BlockStackMergeCollapse device=loop0
           upper_device=loop1 (node_exporter diskstats + the blockstack exporter's stack edges).
  single   loop2 alone; nomerges 0 -> 2: BlockStackMissedMerges device=loop2 (ebpf_exporter's
           missed-merge counter; skipped when ebpf_exporter or its compiled configs are missing).
Loop backing files live on tmpfs (/dev/shm), so loop0 and loop2 have no device beneath them, as
a disk would not. Prometheus scrapes and evaluates every 5 s, as in production; Alertmanager runs
alerts/alertmanager.yml unchanged except the receiver's port. Everything binds 127.0.0.1, every
process and loop device is removed on exit (also on failure), and the whole run is bounded
(about 2.5 minutes).
"""
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import time
import urllib.parse

import pytest

from blockstack_lab import fio, loop, procs

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"
EBPF_EXPORTER = ROOT / ".build" / "bin" / "ebpf_exporter"
EBPF_CONFIGS = ROOT / ".build" / "ebpf-configs"
BLOCKSTACK_EXPORTER = ROOT / ".venv" / "bin" / "blockstack-exporter"
HOST = "itest"
PAGE_TIMEOUT = 90      # seconds from the flip; the rules' worst case is 55 s (alerts/README.md)
RESOLVE_TIMEOUT = 100  # rate window 20 s + evaluation + the page route's group_interval 30 s
FIO_RUNTIME = 240      # fio stops by itself even if the test is killed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for loop devices and sysfs")


def need(binary):
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} not installed")
    return path


def prometheus_config(tmp, ports, with_ebpf):
    jobs = [("node", ports["node"]), ("blockstack", ports["blockstack"])]
    if with_ebpf:
        jobs.append(("ebpf", ports["ebpf"]))
    scrape = "\n".join(
        f"  - job_name: {job}\n"
        f"    static_configs:\n"
        f"      - targets: ['127.0.0.1:{port}']\n"
        f"        labels: {{host: {HOST}}}" for job, port in jobs)
    text = (
        "global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n"
        f"rule_files:\n  - {ALERTS / 'recording.rules.yml'}\n  - {ALERTS / 'alerts.rules.yml'}\n"
        "alerting:\n  alertmanagers:\n    - static_configs:\n"
        f"        - targets: ['127.0.0.1:{ports['alertmanager']}']\n"
        f"scrape_configs:\n{scrape}\n")
    path = tmp / "prometheus.yml"
    path.write_text(text)
    return path


def alertmanager_config(tmp, receiver_port):
    text = (ALERTS / "alertmanager.yml").read_text()
    assert "127.0.0.1:9466" in text
    path = tmp / "alertmanager.yml"
    path.write_text(text.replace("127.0.0.1:9466", f"127.0.0.1:{receiver_port}"))
    return path


def notifications(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def find_alert(path, status, **labels):
    """(record, alert) of the first notification holding an alert with these labels and status."""
    for record in notifications(path):
        for alert in record["notification"]["alerts"]:
            if alert["status"] == status and all(alert["labels"].get(k) == v for k, v in labels.items()):
                return record, alert
    return None


def wait_for(what, timeout, fn, interval=1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = fn()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def query(port, expr):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return json.loads(procs.http_get(url))["data"]["result"]


def write_data(path, size):
    """Real data (not holes) so that reading the file reads loop0."""
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def test_collapse_pages_and_resolves(tmp_path):
    prometheus = need("prometheus")
    alertmanager = need("prometheus-alertmanager")
    node_exporter = need("prometheus-node-exporter")
    need("fio")
    if not BLOCKSTACK_EXPORTER.exists():
        pytest.skip("blockstack-exporter not installed in .venv (make venv)")
    with_ebpf = EBPF_EXPORTER.exists() and (EBPF_CONFIGS / "block_sizes.bpf.o").exists()

    ports = {name: procs.free_port() for name in
             ("receiver", "alertmanager", "prometheus", "node", "blockstack", "ebpf")}
    out = tmp_path / "notifications.jsonl"
    logs = tmp_path / "logs"
    logs.mkdir()

    with contextlib.ExitStack() as stack:
        # --- the lab: loop0 <- ext4 <- file <- loop1, and loop2 alone, all on tmpfs.
        dev0 = stack.enter_context(loop.attached(768 << 20, directory="/dev/shm"))
        mnt = stack.enter_context(loop.ext4(dev0))
        backing = pathlib.Path(mnt) / "loop1.img"
        write_data(backing, 512 << 20)
        dev1 = stack.enter_context(loop.attached(path=str(backing), direct_io=True))
        dev2 = stack.enter_context(loop.attached(256 << 20, directory="/dev/shm"))
        name0, name1, name2 = loop.name(dev0), loop.name(dev1), loop.name(dev2)
        for dev in (dev0, dev1, dev2):
            stack.enter_context(loop.sysfs_setting(dev, "queue/nomerges", 0))
        # Drop the page cache of what was just written, so loop1's reads reach loop0.
        subprocess.run(["sync"], check=True, timeout=60)
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("1")

        # --- the stack.
        def run(name, argv, health):
            return stack.enter_context(procs.running(
                argv, health_url=f"http://127.0.0.1:{ports[health]}{'/healthz' if name == 'receiver' else '/metrics' if health in ('node', 'blockstack', 'ebpf') else '/-/ready'}",
                log_path=logs / f"{name}.log", timeout=60))

        run("receiver", ["python3", str(ALERTS / "receiver" / "page_receiver.py"),
                         f"--listen=127.0.0.1:{ports['receiver']}", f"--file={out}"], "receiver")
        run("alertmanager", [alertmanager, f"--config.file={alertmanager_config(tmp_path, ports['receiver'])}",
                             f"--storage.path={tmp_path / 'am'}",
                             f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
                             "--cluster.listen-address="], "alertmanager")
        run("node", [node_exporter, f"--web.listen-address=127.0.0.1:{ports['node']}",
                     "--collector.disable-defaults", "--collector.diskstats",
                     r"--collector.diskstats.device-exclude=^(ram|fd|sr)\d+$"], "node")
        run("blockstack", [str(BLOCKSTACK_EXPORTER), f"--web.listen-address=127.0.0.1:{ports['blockstack']}"],
            "blockstack")
        if with_ebpf:
            run("ebpf", [str(EBPF_EXPORTER), f"--config.dir={EBPF_CONFIGS}", "--config.names=block_sizes",
                         f"--web.listen-address=127.0.0.1:{ports['ebpf']}"], "ebpf")
        run("prometheus", [prometheus, f"--config.file={prometheus_config(tmp_path, ports, with_ebpf)}",
                           f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                           f"--web.listen-address=127.0.0.1:{ports['prometheus']}"], "prometheus")

        # --- healthy load on both.
        for dev in (dev1, dev2):
            stack.enter_context(procs.running(
                ["fio", f"--name=itest-{loop.name(dev)}", f"--filename={dev}", "--time_based",
                 f"--runtime={FIO_RUNTIME}", *fio.SEQ_BATCHED_READ],
                log_path=logs / f"fio-{loop.name(dev)}.log"))

        # Healthy baseline: Prometheus sees loop1 and loop0 side by side with large requests
        # (and loop2 merging), and nothing pages.
        def healthy_lineup():
            r = query(ports["prometheus"], 'host_device_lower_operation:node_disk_request_size_sectors:lower'
                      f'{{host="{HOST}",device="{name1}",lower="{name0}",operation="read"}} > 64')
            return r and query(ports["prometheus"], 'host_device_operation:node_disk_request_size_sectors:avg'
                               f'{{host="{HOST}",device="{name2}",operation="read"}} > 64')
        wait_for("a healthy lineup of loop1 over loop0 in Prometheus", 60, healthy_lineup)
        assert find_alert(out, "firing", alertname="BlockStackMergeCollapse") is None
        assert find_alert(out, "firing", alertname="BlockStackMissedMerges") is None

        # --- collapse: split loop0's requests at 4 KiB; forbid merging on loop2.
        with contextlib.ExitStack() as collapse:
            collapse.enter_context(loop.sysfs_setting(dev0, "queue/max_sectors_kb", 4))
            if with_ebpf:
                collapse.enter_context(loop.sysfs_setting(dev2, "queue/nomerges", 2))
            flipped = time.time()

            record, alert = wait_for("the BlockStackMergeCollapse page", PAGE_TIMEOUT, lambda: find_alert(
                out, "firing", alertname="BlockStackMergeCollapse", device=name0))
            print(f"layered collapse paged {record['received_at'] - flipped:.1f}s after the flip")
            assert record["path"] == "/page"
            assert record["notification"]["receiver"] == "page"
            assert record["notification"]["groupLabels"] == {"host": HOST, "stack": name1}
            labels = alert["labels"]
            assert labels["severity"] == "critical"
            assert labels["host"] == HOST
            assert labels["upper_device"] == name1
            assert labels["stack"] == name1
            assert labels["operation"] == "read"
            assert labels["nomerges"] == "0"
            assert labels["max_sectors_kb"] == "4"
            assert f"{name0} serves read requests of" in alert["annotations"]["description"]
            assert alert["annotations"]["runbook_url"].endswith("#blockstackmergecollapse")

            if with_ebpf:
                record, alert = wait_for("the BlockStackMissedMerges page", PAGE_TIMEOUT, lambda: find_alert(
                    out, "firing", alertname="BlockStackMissedMerges", device=name2))
                print(f"single-device collapse paged {record['received_at'] - flipped:.1f}s after the flip")
                assert record["path"] == "/page"
                assert record["notification"]["groupLabels"] == {"host": HOST, "stack": name2}
                labels = alert["labels"]
                assert (labels["severity"], labels["host"], labels["nomerges"], labels["stack"]) == \
                    ("critical", HOST, "2", name2)
                assert "echo 0 > /sys/block/%s/queue/nomerges" % name2 in alert["annotations"]["likely_cause"]
                # loop0's split requests are adjacent small requests too: if Prometheus raises a
                # missed-merge alert for loop0, Alertmanager must hold it back behind the collapse.
                am_alerts = json.loads(procs.http_get(
                    f"http://127.0.0.1:{ports['alertmanager']}/api/v2/alerts?filter=alertname%3D%22BlockStackMissedMerges%22"))
                for a in am_alerts:
                    if a["labels"].get("device") == name0:
                        assert a["status"]["inhibitedBy"], a

            # Restored on leaving this block.
        restored = time.time()

        record, _ = wait_for("the BlockStackMergeCollapse resolve", RESOLVE_TIMEOUT, lambda: find_alert(
            out, "resolved", alertname="BlockStackMergeCollapse", device=name0))
        print(f"layered collapse resolved {record['received_at'] - restored:.1f}s after the restore")
        assert record["path"] == "/page"
        if with_ebpf:
            record, _ = wait_for("the BlockStackMissedMerges resolve", RESOLVE_TIMEOUT, lambda: find_alert(
                out, "resolved", alertname="BlockStackMissedMerges", device=name2))
            print(f"single-device collapse resolved {record['received_at'] - restored:.1f}s after the restore")
