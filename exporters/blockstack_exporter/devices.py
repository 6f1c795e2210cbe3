"""The block devices the kernel has, read once per scrape and shared by the collectors.

Sources: /sys/class/block (every disk and partition; a partition's sysfs path sits inside its
disk's directory, see Documentation/ABI/stable/sysfs-block), /sys/dev/block/MAJ:MIN (device
numbers to names) and /proc/1/mountinfo (which block device holds a path; see read_mountinfo).
"""

import os
import re

from .fs import MAX_MOUNTINFO_BYTES, listdir, read_text


class Device:
    __slots__ = ("name", "path", "parent")

    def __init__(self, name, path, parent):
        self.name = name  # kernel name, as in /proc/diskstats: sda1, dm-3, loop0
        self.path = path  # its directory in sysfs
        self.parent = parent  # the disk's name for a partition, else None

    @property
    def queue_owner(self):
        """The device whose queue/ this one uses: a partition shares its disk's queue."""
        return self.parent or self.name


def list_devices(sysfs):
    """All block devices, {name: Device}.

    A partition's sysfs directory sits inside its disk's (…/block/sda/sda1, …/nvme0/nvme0n1/nvme0n1p1),
    so a device whose parent directory is itself a block device is a partition of it. (A disk's
    parent directory is `block` or a controller such as `nvme0`, never a block device.)"""
    class_dir = os.path.join(sysfs, "class", "block")
    paths = {}
    for name in sorted(listdir(class_dir)):
        try:
            target = os.readlink(f"{class_dir}/{name}")
        except OSError:
            continue  # vanished between listing and reading, or not a link in an odd tree
        path = os.path.normpath(os.path.join(class_dir, target))
        paths[name] = path, os.path.basename(os.path.dirname(path))
    devices = {}
    for name, (path, parent) in paths.items():
        devices[name] = Device(name, path, parent if parent in paths else None)
    return devices


def name_of_devno(sysfs, majmin):
    """'7:0' -> 'loop0' through /sys/dev/block, or None if no block device has that number."""
    try:
        return os.path.basename(os.readlink(os.path.join(sysfs, "dev", "block", majmin)))
    except OSError:
        return None


_OCTAL = re.compile(r"\\([0-7]{3})")


class Mount:
    __slots__ = ("mount_id", "majmin", "mountpoint", "fstype", "source")

    def __init__(self, mount_id, majmin, mountpoint, fstype, source):
        self.mount_id, self.majmin, self.mountpoint = mount_id, majmin, mountpoint
        self.fstype, self.source = fstype, source


def _unescape(field):
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...), see proc(5).
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field) if "\\" in field else field


def parse_mountinfo(text):
    """Mounts from /proc/PID/mountinfo (Documentation/filesystems/proc.rst, 3.5) and the number
    of malformed lines skipped (one bad line costs that mount alone)."""
    mounts, bad = [], 0
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-", 6)
            mounts.append(
                Mount(
                    fields[0],
                    fields[2],
                    _unescape(fields[4]),
                    fields[sep + 1],
                    _unescape(fields[sep + 2]),
                )
            )
        except (ValueError, IndexError):
            bad += 1
    return mounts, bad


def read_mountinfo(procfs):
    """The mounts of pid 1's mount namespace, from procfs/1/mountinfo, as node_exporter reads
    them; procfs/self/mountinfo when that cannot be read (EACCES, hidepid=, a fixture tree that
    has self/ only). Both are read to end of file: one read returns a page at most (see fs.py).

    Why pid 1 and not self: in a pod given the host's /proc at /host/proc, "self" names the
    exporter's own pid, whose mount namespace is the container's; pid 1 there is the host's
    init, whose namespace holds the host's mounts (ext4 mountpoints, loop backing files). The
    same holds for the Debian package under systemd when its unit gets a mount namespace of its
    own (ProtectSystem=, PrivateTmp=): pid 1's mountinfo is readable by any user and lists the
    host's mountpoints. In a pid namespace with a /proc of its own, pid 1 is that namespace's
    first process, and its mounts are the ones the exporter's processes see."""
    first = os.path.join(procfs, "1", "mountinfo")
    try:
        return parse_mountinfo(read_text(first, MAX_MOUNTINFO_BYTES))
    except OSError as e1:
        fallback = os.path.join(procfs, "self", "mountinfo")
        try:
            return parse_mountinfo(read_text(fallback, MAX_MOUNTINFO_BYTES))
        except OSError as e2:
            # one error naming both files; OSError(errno, text) is FileNotFoundError,
            # PermissionError, ... as e2 was, so the errors_total reason stays that of e2
            raise OSError(
                e2.errno, f"{first}: {e1.strerror or e1}; {fallback}: {e2.strerror or e2}"
            ) from e2


def mount_holding(mounts, path):
    """The mount whose mountpoint is the longest prefix of path (the last one wins on ties)."""
    best = None
    for m in mounts:
        mp = m.mountpoint
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best.mountpoint):
                best = m
    return best


def layers(start, step):
    """[[start], [its step()s], [theirs], ...]: a stack walked breadth first from start, each
    device once, in the first layer that reaches it (cycle-safe). step(device) gives the devices
    next to it: those beneath (down the stack) or above (up)."""
    out, seen, frontier = [], {start}, [start]
    while frontier:
        out.append(frontier)
        nxt = []
        for d in frontier:
            for n in step(d):
                if n not in seen:
                    seen.add(n)
                    nxt.append(n)
        frontier = nxt
    return out
