"""Live tests on this machine's kernel: loop devices and ext4 made and removed by the tests,
the real exporter scraped over HTTP after each change."""
import os
import re

import pytest

from exporter_testlib import EXPORTER
from blockstack_lab import loop, procs


@pytest.fixture(scope="module")
def exporter():
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with procs.running([EXPORTER, f"--web.listen-address=127.0.0.1:{port}"], health_url=url):
        yield lambda: procs.http_get(url)


def sample(body, metric, **labels):
    """The value of one series in an exposition, or None."""
    want = {k: str(v) for k, v in labels.items()}
    for line in body.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if m and m[1] == metric and dict(re.findall(r'(\w+)="([^"]*)"', m[2])) == want:
            return float(m[3])
    return None


def test_nomerges_and_max_sectors_kb_changes_show_on_the_next_scrape(exporter):
    with loop.attached(64 << 20) as dev:
        name = loop.name(dev)
        assert sample(exporter(), "blockstack_queue_nomerges", device=name) == 0
        with loop.sysfs_setting(dev, "queue/nomerges", "2"):
            assert sample(exporter(), "blockstack_queue_nomerges", device=name) == 2
            with loop.sysfs_setting(dev, "queue/max_sectors_kb", "4"):
                assert sample(exporter(), "blockstack_queue_max_sectors_bytes", device=name) == 4096
            assert sample(exporter(), "blockstack_queue_max_sectors_bytes", device=name) > 4096
        assert sample(exporter(), "blockstack_queue_nomerges", device=name) == 0


def test_ext4_dioread_option_flips_with_the_mount(exporter):
    with loop.attached(64 << 20) as dev:
        name = loop.name(dev)
        loop.mkfs_ext4(dev, ["-J", "size=4"])
        with loop.mounted(dev) as mnt:
            body = exporter()
            # the kernel default since 5.6: shown in /proc/fs/ext4, not in /proc/mounts
            assert sample(body, "blockstack_ext4_dioread_nolock", device=name, mountpoint=mnt) == 1
            assert sample(body, "blockstack_ext4_journal_size_bytes", device=name, mountpoint=mnt) == 4 << 20
        with loop.mounted(dev, "dioread_lock") as mnt:
            body = exporter()
            assert sample(body, "blockstack_ext4_dioread_nolock", device=name, mountpoint=mnt) == 0
            assert sample(body, "blockstack_ext4_option_info", device=name, mountpoint=mnt,
                          option="nodioread_nolock", value="") == 1
            with open(os.path.join(mnt, "f"), "wb") as f:
                f.write(b"x" * 65536)
                os.fsync(f.fileno())
            jbd2 = sample(exporter(), "blockstack_jbd2_transactions_total", device=name, journal=f"{name}-8")
            assert jbd2 is not None and jbd2 >= 1
        assert sample(exporter(), "blockstack_ext4_dioread_nolock", device=name, mountpoint=mnt) is None


def test_loop_on_a_file_on_ext4_on_a_loop_is_one_stack(exporter):
    with loop.attached(128 << 20) as lower, loop.ext4(lower) as mnt, _upper(mnt) as upper:
        body = exporter()
        lo, up = loop.name(lower), loop.name(upper)
        assert sample(body, "blockstack_device_lower_info", device=up, lower=lo) == 1
        assert sample(body, "blockstack_device_beneath_info", device=up, lower=lo, depth="1") == 1
        assert sample(body, "blockstack_device_holders", device=lo) == 1
        assert sample(body, "blockstack_device_holders", device=up) == 0


def _upper(mnt):
    """A loop device over a sparse file on the mounted filesystem."""
    path = os.path.join(mnt, "upper.img")
    with open(path, "wb") as f:
        f.truncate(32 << 20)
    return loop.attached(path=path)
