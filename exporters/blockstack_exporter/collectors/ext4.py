"""ext4 effective mount options and journal size.

/proc/mounts does not show options that are defaults (dioread_nolock became one in 5.6 and
the ext4 incident hid behind it); /proc/fs/ext4/DEV/options lists every option in effect,
one per line (fs/ext4/super.c _ext4_show_options with the "show all" flag).
The journal size comes from the superblock: s_jnl_blocks[15..16] keep a copy of the journal
inode's i_size_high/i_size (fs/ext4/ext4.h, struct ext4_super_block; EXT3_JNL_BACKUP_BLOCKS).
"""
import os
import struct

from prometheus_client.core import GaugeMetricFamily

from ..fs import ParseError, listdir, read_text

EXT4_SUPER_MAGIC = 0xEF53
EXT3_JNL_BACKUP_BLOCKS = 1  # s_jnl_backup_type when s_jnl_blocks holds a journal inode copy


def parse_options(text):
    """Lines 'flag' or 'key=value' -> [(option, value)] in file order."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        out.append((key, value if sep else ""))
    return out


def parse_superblock_journal_bytes(sb):
    """Journal size in bytes from the 1024-byte ext4 superblock, or None for an external journal."""
    if len(sb) < 1024:
        raise ParseError(f"superblock: short read ({len(sb)} bytes)")
    magic, = struct.unpack_from("<H", sb, 0x38)
    if magic != EXT4_SUPER_MAGIC:
        raise ParseError(f"superblock: bad magic {magic:#x}")
    journal_inum, = struct.unpack_from("<I", sb, 0xE0)
    backup_type = sb[0xFD]
    if journal_inum == 0 or backup_type != EXT3_JNL_BACKUP_BLOCKS:
        return None  # no internal journal, or no backup copy of its inode
    size_high, size_low = struct.unpack_from("<II", sb, 0x10C + 15 * 4)
    return (size_high << 32) | size_low


def read_superblock(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, 1024, 1024)
    finally:
        os.close(fd)


class Ext4Collector:
    name = "ext4"

    def collect(self, scrape):
        option_info = GaugeMetricFamily(
            "blockstack_ext4_option_info",
            "Every mount option in effect for an ext4 filesystem, from /proc/fs/ext4/DEV/options "
            "(defaults included, unlike /proc/mounts); value always 1.",
            labels=["device", "mountpoint", "option", "value"])
        dioread_nolock = GaugeMetricFamily(
            "blockstack_ext4_dioread_nolock",
            "Whether dioread_nolock is in effect (1) or dioread_lock (0).", labels=["device", "mountpoint"])
        delalloc = GaugeMetricFamily(
            "blockstack_ext4_delalloc",
            "Whether delayed allocation is in effect (1) or nodelalloc (0).", labels=["device", "mountpoint"])
        commit = GaugeMetricFamily(
            "blockstack_ext4_commit_interval_seconds",
            "Journal commit interval (commit=), in seconds.", labels=["device", "mountpoint"])
        journal = GaugeMetricFamily(
            "blockstack_ext4_journal_size_bytes",
            "Size of the filesystem's internal journal, in bytes.", labels=["device", "mountpoint"])

        ext4_dir = os.path.join(scrape.paths.procfs, "fs", "ext4")
        mountpoints = self._mountpoints(scrape)
        for device in sorted(listdir(ext4_dir)):
            mountpoint = mountpoints.get(device, "")
            labels = [device, mountpoint]
            try:
                options = parse_options(read_text(os.path.join(ext4_dir, device, "options")))
            except FileNotFoundError:
                continue  # unmounted between listing and reading
            except OSError as e:
                scrape.error(f"{device}: options: {e}")
                continue
            present = {}
            for option, value in options:
                option_info.add_metric(labels + [option, value], 1)
                present[option] = value
            dioread_nolock.add_metric(labels, 1 if "dioread_nolock" in present else 0)
            delalloc.add_metric(labels, 0 if "nodelalloc" in present else 1)
            if "commit" in present:
                try:
                    commit.add_metric(labels, int(present["commit"]))
                except ValueError:
                    scrape.error(f"{device}: commit={present['commit']!r} is not a number")
            try:
                size = parse_superblock_journal_bytes(read_superblock(os.path.join(scrape.paths.dev, device)))
                if size is not None:
                    journal.add_metric(labels, size)
            except (OSError, ParseError) as e:
                scrape.error(f"{device}: journal size: {e}")
        yield from (option_info, dioread_nolock, delalloc, commit, journal)

    @staticmethod
    def _mountpoints(scrape):
        """Kernel device name -> first ext4 mountpoint, matched by device number."""
        from ..devices import name_of_devno
        out = {}
        for m in scrape.mounts:
            if m.fstype == "ext4":
                name = name_of_devno(scrape.paths.sysfs, m.majmin)
                if name and name not in out:
                    out[name] = m.mountpoint
        return out
