"""Live tests on this machine's kernel: loop devices and ext4 made and removed by the tests,
the real exporter scraped over HTTP after each change."""

import contextlib
import errno
import fcntl
import os
import re
import subprocess
import time

import pytest
from exporter_testlib import EXPORTER, Scraped

from blockstack_lab import loop
from blockstack_testsupport import procs
from blockstack_testsupport.clock import seconds

pytestmark = [pytest.mark.root]


@pytest.fixture(scope="module")
def exporter():
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with procs.running([EXPORTER, f"--web.listen-address=127.0.0.1:{port}"], health_url=url):
        yield lambda: Scraped(procs.http_get(url))


def test_nomerges_and_max_sectors_kb_changes_show_on_the_next_scrape(exporter):
    with loop.attached(64 << 20) as dev:
        name = loop.name(dev)
        assert exporter().get("blockstack_queue_nomerges", device=name) == 0
        with loop.sysfs_setting(dev, "queue/nomerges", "2"):
            assert exporter().get("blockstack_queue_nomerges", device=name) == 2
            with loop.sysfs_setting(dev, "queue/max_sectors_kb", "4"):
                assert exporter().get("blockstack_queue_max_sectors_bytes", device=name) == 4096
            assert exporter().get("blockstack_queue_max_sectors_bytes", device=name) > 4096
        assert exporter().get("blockstack_queue_nomerges", device=name) == 0


def test_ext4_dioread_option_flips_with_the_mount(exporter):
    with loop.attached(64 << 20) as dev:
        name = loop.name(dev)
        loop.mkfs_ext4(dev, ["-J", "size=4"])
        with loop.mounted(dev) as mnt:
            s = exporter()
            # the kernel default since 5.6: shown in /proc/fs/ext4, not in /proc/mounts
            assert s.get("blockstack_ext4_dioread_nolock", device=name, mountpoint=mnt) == 1
            assert (
                s.get("blockstack_ext4_journal_size_bytes", device=name, mountpoint=mnt) == 4 << 20
            )
        with loop.mounted(dev, "dioread_lock") as mnt:
            s = exporter()
            assert s.get("blockstack_ext4_dioread_nolock", device=name, mountpoint=mnt) == 0
            assert (
                s.get(
                    "blockstack_ext4_option_info",
                    device=name,
                    mountpoint=mnt,
                    option="nodioread_nolock",
                    value="",
                )
                == 1
            )
            with open(os.path.join(mnt, "f"), "wb") as f:
                f.write(b"x" * 65536)
                os.fsync(f.fileno())
            jbd2 = exporter().get(
                "blockstack_jbd2_transactions_total", device=name, journal=f"{name}-8"
            )
            assert jbd2 is not None and jbd2 >= 1
        assert exporter().get("blockstack_ext4_dioread_nolock", device=name, mountpoint=mnt) is None


def test_loop_on_a_file_on_ext4_on_a_loop_is_one_stack(exporter):
    with loop.attached(128 << 20) as lower, loop.ext4(lower) as mnt, _upper(mnt) as upper:
        s = exporter()
        lo, up = loop.name(lower), loop.name(upper)
        assert s.get("blockstack_device_lower_info", device=up, lower=lo) == 1
        assert s.get("blockstack_device_beneath_info", device=up, lower=lo, depth="1") == 1
        assert s.get("blockstack_device_holders", device=lo) == 1
        assert s.get("blockstack_device_holders", device=up) == 0


def _upper(mnt):
    """A loop device over a sparse file on the mounted filesystem."""
    path = os.path.join(mnt, "upper.img")
    with open(path, "wb") as f:
        f.truncate(32 << 20)
    return loop.attached(path=path)


# include/uapi/linux/loop.h: ioctls on /dev/loop-control that make and remove loop devices
LOOP_CTL_ADD, LOOP_CTL_REMOVE = 0x4C80, 0x4C81


def _loop_control(request, number):
    """LOOP_CTL_ADD or LOOP_CTL_REMOVE of loopNUMBER; False if the number is taken (EEXIST) or
    the device stays busy (EBUSY: udev probing a device just detached) for three seconds (the
    tests' clock)."""
    fd = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    deadline = time.monotonic() + seconds(3)
    try:
        while True:
            try:
                fcntl.ioctl(fd, request, number)
                return True
            except OSError as e:
                if e.errno == errno.EEXIST:
                    return False
                if e.errno != errno.EBUSY:
                    raise
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
    finally:
        os.close(fd)


def test_loop_device_removed_and_made_again_between_scrapes(exporter):
    """The exporter keeps sysfs attributes open from one scrape to the next. A device removed
    and made again under the same name between two scrapes is a new kernfs node: the old
    descriptors fail with ENODEV and the new device's values must be read, not the old ones.
    logical_block_size also shows why such attributes are not cached: it changes with the
    device behind the name (and with LOOP_SET_BLOCK_SIZE on a live loop device)."""
    with loop.backing_file(16 << 20) as path:
        dev = subprocess.run(
            ["losetup", "--find", "--show", "--sector-size", "4096", path],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        try:
            name = loop.name(dev)
            assert exporter().get("blockstack_queue_logical_block_size_bytes", device=name) == 4096
        finally:
            loop.detach(dev)
    number = int(name[len("loop") :])
    if not _loop_control(LOOP_CTL_REMOVE, number):
        pytest.skip(f"{name} stayed busy after detach; cannot remove it")
    if not _loop_control(LOOP_CTL_ADD, number):
        pytest.skip(f"{name} was taken by someone else meanwhile")
    assert exporter().get("blockstack_queue_logical_block_size_bytes", device=name) == 512


def test_mountinfo_of_a_mount_namespace_with_many_mounts(tmp_path):
    """The exporter in a private mount namespace holding 120 tmpfs mounts (mountinfo ~15 KiB:
    procfs hands it out a page per read), then ext4 on a loop device mounted last: its
    mountpoint label must be read from the end of mountinfo, not left empty."""
    base = str(tmp_path)
    mnt = os.path.join(base, "ext4")
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with loop.attached(32 << 20) as dev:
        loop.mkfs_ext4(dev)
        script = (
            f"set -e; for i in $(seq 1 120); do mkdir -p {base}/t$i; mount -t tmpfs -o size=64k t$i {base}/t$i; done; "
            f"mkdir -p {mnt}; mount {dev} {mnt}; "
            f"test $(wc -c < /proc/self/mountinfo) -gt 8192; "
            f"{EXPORTER} --web.listen-address=127.0.0.1:{port} --no-collector.dm & wait"
        )
        # the namespace, and every mount in it, goes away with the exporter. A pid namespace
        # with a /proc of its own too: the exporter reads pid 1's mountinfo (devices.py), and
        # pid 1 there is the shell that made the mounts. The exporter is its child, not pid 1
        # itself: an init without a handler ignores the SIGTERM that ends the test.
        with procs.running(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "sh",
                "-c",
                script,
            ],
            health_url=url,
            log_path=str(tmp_path / "exporter.log"),
        ):
            s = Scraped(procs.http_get(url))
        name = loop.name(dev)
        assert s.get("blockstack_ext4_dioread_nolock", device=name, mountpoint=mnt) == 1, s.series(
            "blockstack_ext4_dioread_nolock"
        )
        assert s.get("blockstack_collector_errors_total", collector="stack", reason="parse") is None


def _scrape_once(tmp_path, *flags, argv=()):
    """One scrape of an exporter started with `flags` (after `argv`, e.g. an unshare)."""
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    command = [
        *argv,
        EXPORTER,
        f"--web.listen-address=127.0.0.1:{port}",
        "--no-collector.dm",
        *flags,
    ]
    with procs.running(command, health_url=url, log_path=str(tmp_path / "exporter.log")):
        return Scraped(procs.http_get(url))


def test_mountpoints_are_pid_1s_in_a_mount_namespace_of_its_own(tmp_path):
    """A pod's view: the exporter in a mount namespace of its own where the ext4 filesystem is not
    mounted, with the host's /proc. Its mountpoint label is the host's, read from pid 1's
    mountinfo, not empty as in the exporter's own."""
    with loop.attached(32 << 20) as dev, loop.ext4(dev) as mnt:
        with open("/proc/1/mountinfo") as f:
            if f" {mnt} " not in f.read():
                # a core test: fail loudly rather than skip (make test runs as root on the host,
                # in pid 1's mount namespace)
                pytest.fail(
                    f"pid 1 does not see {mnt}: the tests run in another mount namespace than "
                    "pid 1's; run them on the host"
                )
        s = _scrape_once(
            tmp_path,
            argv=[
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f'umount {mnt} && exec "$0" "$@"',
            ],
        )
        name = loop.name(dev)
        assert s.get("blockstack_ext4_dioread_nolock", device=name, mountpoint=mnt) == 1, s.series(
            "blockstack_ext4_dioread_nolock"
        )


def _dumpe2fs_journal_bytes(dev):
    """The journal's size as dumpe2fs -h prints it: "Total journal size: 16M" (e2fsprogs 1.46+,
    fast-commit area included) or "Journal size: 4096k"."""
    text = subprocess.run(
        ["dumpe2fs", "-h", dev], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    sizes = dict(re.findall(r"^(Total journal size|Journal size):\s+(\d+[kMG])$", text, re.M))
    size = sizes.get("Total journal size") or sizes["Journal size"]
    return int(size[:-1]) << {"k": 10, "M": 20, "G": 30}[size[-1]]


def test_journal_size_without_the_devices_equals_the_superblocks(tmp_path):
    """A pod's view: ext4 of 1 KiB and 4 KiB blocks with 4, 16 and 64 MiB journals, and an
    exporter whose --path.dev holds no devices. Its journal sizes, derived from /proc/fs/jbd2 and
    mb_structs_summary, equal the superblock's (an exporter with the real /dev) and dumpe2fs's."""
    empty_dev = tmp_path / "dev"
    empty_dev.mkdir()
    with contextlib.ExitStack() as stack:
        made = []  # (device name, mountpoint, journal bytes per dumpe2fs, -J size in MiB)
        for block_size in (1024, 4096):
            for mib in (4, 16, 64):
                dev = stack.enter_context(loop.attached(300 << 20))
                mnt = stack.enter_context(
                    loop.ext4(dev, ["-b", str(block_size), "-J", f"size={mib}"])
                )
                made.append((loop.name(dev), mnt, _dumpe2fs_journal_bytes(dev), mib))
        superblock = _scrape_once(tmp_path)
        proc = _scrape_once(tmp_path, f"--path.dev={empty_dev}")
        for name, mnt, dumpe2fs, mib in made:
            labels = {"device": name, "mountpoint": mnt}
            got = proc.get("blockstack_ext4_journal_size_bytes", **labels)
            assert got == superblock.get("blockstack_ext4_journal_size_bytes", **labels), labels
            assert got == dumpe2fs == mib << 20, labels
