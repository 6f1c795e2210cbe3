"""Bad input never crashes the exporter: it counts an error, logs it, and serves the rest."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from exporter_testlib import EXPORTER, HOST_LOOP, Scraped, registry_for

from blockstack_testsupport import procs

LOOP0_QUEUE = "sys/devices/virtual/block/loop0/queue"


def scrape_tree(tree):
    return Scraped(registry_for(tree))


def write(tree, rel, text):
    path = os.path.join(tree, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_garbage_number_drops_one_sample_and_counts_an_error(host_tree, caplog):
    write(host_tree, f"{LOOP0_QUEUE}/nomerges", "two\n")
    s = scrape_tree(host_tree)
    assert s.get("blockstack_queue_nomerges", device="loop0") is None
    assert s.get("blockstack_queue_max_sectors_bytes", device="loop0") == 4096
    assert s.get("blockstack_queue_nomerges", device="loop1") == 0
    assert s.errors("queue") == 1
    assert s.success("queue") == 1
    assert "loop0: nomerges: value: expected a non-negative integer, got 'two'" in caplog.text


def test_odd_scheduler_and_negative_value(host_tree):
    write(host_tree, f"{LOOP0_QUEUE}/scheduler", "none [mq-deadline\n")
    write(host_tree, f"{LOOP0_QUEUE}/read_ahead_kb", "-4\n")
    s = scrape_tree(host_tree)
    assert s.errors("queue") == 2
    assert s.get("blockstack_queue_read_ahead_bytes", device="loop0") is None
    assert s.get("blockstack_queue_nomerges", device="loop0") == 2


def test_device_vanishing_between_listing_and_reading(host_tree):
    # The class/block link stays (listed) but the device directory is gone (removed meanwhile).
    shutil.rmtree(os.path.join(host_tree, "sys/devices/virtual/block/loop1"))
    s = scrape_tree(host_tree)
    assert s.errors("queue") >= 1
    assert s.get("blockstack_queue_nomerges", device="loop1") is None
    assert s.get("blockstack_queue_nomerges", device="loop0") == 2
    for c in ("queue", "stack", "ext4", "jbd2"):
        assert s.success(c) == 1


def test_missing_procfs_files_fail_only_what_needs_them(host_tree):
    os.unlink(os.path.join(host_tree, "proc/self/mountinfo"))
    write(host_tree, "proc/fs/jbd2/loop0-8/info", "this is not jbd2\n")
    s = scrape_tree(host_tree)
    # without mountinfo: one error, no loop edges and no mountpoints, but every collector serves
    assert s.errors("stack") == 1
    assert s.get("blockstack_device_lower_info", device="loop1", lower="loop0") is None
    assert s.get("blockstack_ext4_dioread_nolock", device="loop1", mountpoint="") == 0
    assert s.errors("jbd2") == 1
    for c in ("queue", "stack", "ext4", "jbd2"):
        assert s.success(c) == 1
    assert (
        s.get("blockstack_jbd2_transactions_total", device="loop1", journal="loop1-8") is not None
    )


def test_empty_tree_is_an_empty_scrape_not_a_crash(tmp_path):
    s = scrape_tree(str(tmp_path))
    for c in ("queue", "stack", "dm", "jbd2"):
        assert s.success(c) == 1


@pytest.mark.root  # drops privileges to nobody with setpriv
def test_permission_denied_as_an_unprivileged_exporter(tmp_path):
    """Run the real exporter as nobody (root reads everything, so drop privileges) over a tree
    where one queue file is mode 000: the scrape answers, the error is counted."""
    base = tempfile.mkdtemp(
        prefix="blockstack-perm-"
    )  # /tmp/pytest-of-root is 0700: not for nobody
    try:
        os.chmod(base, 0o755)
        host_tree = os.path.join(base, "tree")
        shutil.copytree(HOST_LOOP, host_tree, symlinks=True)
        os.chmod(os.path.join(host_tree, f"{LOOP0_QUEUE}/nomerges"), 0)
        _scrape_as_nobody(host_tree, tmp_path)
    finally:
        shutil.rmtree(base)


def _scrape_as_nobody(host_tree, tmp_path):
    port = procs.free_port()
    argv = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        EXPORTER,
        f"--web.listen-address=127.0.0.1:{port}",
        f"--path.sysfs={host_tree}/sys",
        f"--path.procfs={host_tree}/proc",
        f"--path.dev={host_tree}/dev",
    ]
    log = tmp_path / "exporter.log"
    with procs.running(argv, health_url=f"http://127.0.0.1:{port}/metrics", log_path=str(log)):
        s = Scraped(procs.http_get(f"http://127.0.0.1:{port}/metrics"))
    assert s.get("blockstack_queue_nomerges", device="loop1") == 0
    assert s.get("blockstack_queue_nomerges", device="loop0") is None
    assert s.errors("queue", "unreadable") >= 1  # one per scrape (the health check scraped too)
    assert "Permission denied" in log.read_text()


def test_exporter_never_opens_anything_under_sysfs_for_writing(host_tree):
    """An audit hook sees every open() of a real scrape; none may ask for write access under sysfs."""
    code = r"""
import os, sys
sysfs = sys.argv[1]
bad = []
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(sysfs):
        mode, flags = args[1], args[2]
        if (mode and any(c in mode for c in "wax+")) or (flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)):
            bad.append(args[0])
sys.addaudithook(hook)
from prometheus_client import generate_latest
from blockstack_exporter.main import build_registry, parse_args
reg = build_registry(parse_args([f"--path.sysfs={sysfs}", f"--path.procfs={sys.argv[2]}", f"--path.dev={sys.argv[3]}"]))
out = generate_latest(reg).decode()
assert "blockstack_queue_nomerges" in out, out[:200]
print("WRITES", bad)
"""
    out = subprocess.run(
        [sys.executable, "-c", code, f"{host_tree}/sys", f"{host_tree}/proc", f"{host_tree}/dev"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "WRITES []" in out


def test_devices_vanishing_and_appearing_between_scrapes(host_tree):
    """One exporter over several scrapes, as in production: the descriptors it keeps open for
    sysfs attributes must not make it serve a gone device or miss a new one. (On real sysfs a
    descriptor of a removed device fails with ENODEV, see test_live.py; a fixture's regular
    files keep their content after removal, so here each change is seen by a scrape first.)"""
    registry = registry_for(host_tree)
    loop1 = "sys/devices/virtual/block/loop1"
    links = ("sys/class/block/loop1", "sys/block/loop1", "sys/dev/block/7:1")
    saved = {link: os.readlink(os.path.join(host_tree, link)) for link in links}

    s = Scraped(registry)
    assert s.get("blockstack_queue_nomerges", device="loop1") == 0
    assert s.get("blockstack_device_holders", device="loop0") == 1
    assert kept_open(os.path.join(host_tree, loop1, "")) > 0

    # loop1 removed: gone from every collector's output, no error, its descriptors closed
    shutil.rmtree(os.path.join(host_tree, loop1))
    for link in links:
        os.unlink(os.path.join(host_tree, link))
    s = Scraped(registry)
    assert s.get("blockstack_queue_nomerges", device="loop1") is None
    assert s.get("blockstack_device_lower_info", device="loop1", lower="loop0") is None
    assert s.get("blockstack_device_holders", device="loop0") == 0
    assert s.get("blockstack_device_holders", device="loop2") == 1  # the others unchanged
    assert s.errors("queue") == 0 and s.errors("stack") == 0
    assert kept_open(os.path.join(host_tree, loop1, "")) == 0

    # a new loop1 with other settings: read afresh, not from what the old one showed
    shutil.copytree(os.path.join(HOST_LOOP, loop1), os.path.join(host_tree, loop1))
    write(host_tree, f"{loop1}/queue/nomerges", "1\n")
    for link, target in saved.items():
        os.symlink(target, os.path.join(host_tree, link))
    s = Scraped(registry)
    assert s.get("blockstack_queue_nomerges", device="loop1") == 1
    assert s.get("blockstack_device_lower_info", device="loop1", lower="loop0") == 1
    assert s.errors("queue") == 0 and s.errors("stack") == 0


def kept_open(directory):
    """How many of this process's descriptors are open on files under `directory`."""
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed meanwhile
            pass
    return sum(p.startswith(directory) for p in paths)
