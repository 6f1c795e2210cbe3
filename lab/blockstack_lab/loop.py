"""Loop devices, ext4 filesystems and sysfs settings as context managers.

Every context manager undoes what it did on exit, whether the body returned or raised,
so tests and the lab leave no loop device, mount or changed queue setting behind.
"""

import contextlib
import os
import subprocess
import tempfile
import time

SYS_BLOCK = "/sys/block"
# mkfs_args for ext4 in a stacked pair: mkfs.ext4 discards by default; on a direct-io upper that
# punches holes in its backing file, and reads of holes never reach the lower device. (mke2fs
# keeps the last -E.)
NO_DISCARD = ["-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard"]


def _run(argv, timeout=60):
    return subprocess.run(
        argv, check=True, capture_output=True, text=True, timeout=timeout
    ).stdout.strip()


def name(dev):
    """'/dev/loop3' -> 'loop3'."""
    return os.path.basename(dev)


@contextlib.contextmanager
def backing_file(size_bytes, directory=None):
    """A sparse file of size_bytes, removed on exit."""
    fd, path = tempfile.mkstemp(prefix="blockstack-lab-", suffix=".img", dir=directory)
    try:
        os.ftruncate(fd, size_bytes)
        os.close(fd)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def attached(size_bytes=256 << 20, directory=None, direct_io=False, path=None):
    """Attach a loop device over a fresh sparse file (or over `path`); yields '/dev/loopN'."""
    with contextlib.ExitStack() as stack:
        if path is None:
            path = stack.enter_context(backing_file(size_bytes, directory))
        argv = ["losetup", "--find", "--show"]
        if direct_io:
            argv.append("--direct-io=on")
        dev = _run(argv + [path])
        try:
            yield dev
        finally:
            detach(dev)


def detach(dev):
    """Detach a loop device, retrying briefly while the kernel still holds it (bounded)."""
    for _ in range(20):
        if subprocess.run(["losetup", "-d", dev], capture_output=True, timeout=30).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["losetup", "-d", dev], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def mounted(dev, options="", fstype="ext4", directory=None):
    """Mount dev on a fresh temporary directory (in `directory`, default the system's temporary
    directory); unmount (lazily if busy) on exit."""
    mnt = tempfile.mkdtemp(prefix="blockstack-mnt-", dir=directory)
    argv = ["mount", "-t", fstype] + (["-o", options] if options else []) + [dev, mnt]
    try:
        _run(argv)
        try:
            yield mnt
        finally:
            umount(mnt)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(mnt)


def umount(mnt):
    for _ in range(20):
        if subprocess.run(["umount", mnt], capture_output=True, timeout=60).returncode == 0:
            return
        time.sleep(0.2)
    subprocess.run(["umount", "-l", mnt], check=True, capture_output=True, timeout=60)


def mkfs_ext4(dev, args=()):
    """mkfs.ext4 quietly, without lazy init (so background writes do not disturb measurements)."""
    _run(
        ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", *args, dev],
        timeout=300,
    )


@contextlib.contextmanager
def ext4(dev, mkfs_args=(), mount_options="", directory=None):
    """Make an ext4 filesystem on dev and mount it; yields the mountpoint."""
    mkfs_ext4(dev, mkfs_args)
    with mounted(dev, mount_options, directory=directory) as mnt:
        yield mnt


def fill(path, size_bytes, chunk_bytes=4 << 20):
    """Write size_bytes of data to path (not a hole, not unwritten extents: reads of it reach the
    device beneath) and fsync it."""
    chunk = b"\xa5" * chunk_bytes
    with open(path, "wb") as f:
        for _ in range(size_bytes // chunk_bytes):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def stacked_pair(lower_size, upper_size, directory=None, mount_directory=None, sparse=False):
    """The stacked pair of the NVMe incident: an upper loop device (direct-io) over a file on ext4
    on a lower loop device over a sparse file in `directory`. The upper's file is written in full,
    so that reads of it reach the lower device (sparse=True: a hole, for a filesystem to be made
    on the upper). Yields (lower, upper, the lower's mountpoint); all undone on exit."""
    with contextlib.ExitStack() as es:
        lower = es.enter_context(attached(lower_size, directory=directory))
        mnt = es.enter_context(ext4(lower, NO_DISCARD, directory=mount_directory))
        backing = os.path.join(mnt, "upper.img")
        if sparse:
            with open(backing, "wb") as f:
                f.truncate(upper_size)
        else:
            fill(backing, upper_size)
        yield lower, es.enter_context(attached(path=backing, direct_io=True)), mnt


def attached_devices():
    """{'/dev/loopN': backing file} for every attached loop device (losetup's view)."""
    out = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    devices = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if parts:
            devices[parts[0]] = parts[1].strip() if len(parts) > 1 else ""
    return devices


def read_sysfs(dev, attr):
    with open(os.path.join(SYS_BLOCK, name(dev), attr)) as f:
        return f.read().strip()


def write_sysfs(dev, attr, value):
    with open(os.path.join(SYS_BLOCK, name(dev), attr), "w") as f:
        f.write(str(value))


@contextlib.contextmanager
def sysfs_setting(dev, attr, value):
    """Set /sys/block/DEV/ATTR to value; restore the previous value on exit."""
    with sysfs_restored(dev, attr) as old:
        write_sysfs(dev, attr, value)
        yield old


@contextlib.contextmanager
def sysfs_restored(dev, attr):
    """/sys/block/DEV/ATTR as it is now (a scheduler: the one in brackets), written back on exit
    whatever the block changed: a loop device's queue settings outlive its detach, and the next
    test to attach it would inherit them."""
    old = read_sysfs(dev, attr)
    if attr.endswith("scheduler"):
        old = old.split("[", 1)[1].split("]", 1)[0] if "[" in old else old
    try:
        yield old
    finally:
        write_sysfs(dev, attr, old)
