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

from ..fs import BlockingReads, ParseError, listdir, parse_uint, read_text
from ..scrape import Reuse, reason_of

EXT4_SUPER_MAGIC = 0xEF53
EXT3_JNL_BACKUP_BLOCKS = 1  # s_jnl_backup_type when s_jnl_blocks holds a journal inode copy
MAX_OPTIONS_BYTES = 65536  # the options file is a few hundred bytes
MAX_OPTIONS = 128  # options per filesystem; ext4 has about 80 in all


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
    (magic,) = struct.unpack_from("<H", sb, 0x38)
    if magic != EXT4_SUPER_MAGIC:
        raise ParseError(f"superblock: bad magic {magic:#x}")
    (journal_inum,) = struct.unpack_from("<I", sb, 0xE0)
    backup_type = sb[0xFD]
    if journal_inum == 0 or backup_type != EXT3_JNL_BACKUP_BLOCKS:
        return None  # no internal journal, or no backup copy of its inode
    size_high, size_low = struct.unpack_from("<II", sb, 0x10C + 15 * 4)
    return (size_high << 32) | size_low


class Ext4Collector:
    """The journal's size cannot change while the filesystem is mounted (resizing a journal needs
    it unmounted), so the superblock is read once per mount (the mount ID of mountinfo), never
    on every scrape. That read goes to a device that may hang, or to whatever sits at /dev/DEV:
    it runs with the collector's deadline (fs.BlockingReads) and a stuck device costs its
    journal size alone."""

    name = "ext4"

    def __init__(self):
        self.reads = BlockingReads()
        self._journal = {}  # (device, mount id) -> journal bytes or None (external journal)
        # the families, built again only when something read changed: worth 10 % of a 1024-device
        # scrape's CPU, 23 % with jbd2's (make bench-exporter --without reuse-ext4+reuse-jbd2)
        self._reuse = Reuse()
        self._part = {}  # the Host's ext4 part, of the families built last

    def collect(self, scrape):
        ext4_dir = os.path.join(scrape.paths.procfs, "fs", "ext4")
        mounts = self._mounts(scrape)
        try:
            names = sorted(listdir(ext4_dir))
        except OSError as e:
            scrape.error(f"{ext4_dir}: {e}", reason_of(e), subject="ext4 dir")
            names = []
        journals = {}
        read = []  # (device, mountpoint, options text, journal bytes or None) of each filesystem
        for i, device in enumerate(names):
            if scrape.past_deadline("the remaining filesystems", len(names) - i):
                break
            mount = mounts.get(device)
            try:
                text = read_text(os.path.join(ext4_dir, device, "options"), MAX_OPTIONS_BYTES)
            except FileNotFoundError:
                continue  # unmounted between listing and reading
            except (OSError, ParseError) as e:
                scrape.error(f"{device}: options: {e}", reason_of(e), subject=f"{device} options")
                continue
            key = (device, mount.mount_id if mount else None)
            size = self._journal.get(key) if key[1] is not None else None
            if key not in self._journal or key[1] is None:
                try:
                    sb = self.reads.pread(
                        os.path.join(scrape.paths.dev, device), 1024, 1024, scrape.remaining()
                    )
                    size = parse_superblock_journal_bytes(sb)
                    if key[1] is not None:
                        journals[key] = size
                except (OSError, ParseError) as e:  # the options are still published
                    scrape.error(
                        f"{device}: journal size: {e}",
                        reason_of(e),
                        subject=f"{device} journal size",
                    )
                    size = None
            else:
                journals[key] = size
            read.append((device, mount.mountpoint if mount else "", text, size))
        self._journal = journals  # only mounts still there are kept
        read = tuple(read)
        families = self._reuse.families_for(scrape, read, lambda: self._build(scrape, read))
        scrape.host.ext4 = self._part
        return families

    def _build(self, scrape, read):
        self._part = {}
        option_info = GaugeMetricFamily(
            "blockstack_ext4_option_info",
            "Every mount option in effect for an ext4 filesystem, from /proc/fs/ext4/DEV/options "
            "(defaults included, unlike /proc/mounts); value always 1.",
            labels=["device", "mountpoint", "option", "value"],
        )
        dioread_nolock = GaugeMetricFamily(
            "blockstack_ext4_dioread_nolock",
            "Whether dioread_nolock is in effect (1) or dioread_lock (0).",
            labels=["device", "mountpoint"],
        )
        delalloc = GaugeMetricFamily(
            "blockstack_ext4_delalloc",
            "Whether delayed allocation is in effect (1) or nodelalloc (0).",
            labels=["device", "mountpoint"],
        )
        commit = GaugeMetricFamily(
            "blockstack_ext4_commit_interval_seconds",
            "Journal commit interval (commit=), in seconds.",
            labels=["device", "mountpoint"],
        )
        journal = GaugeMetricFamily(
            "blockstack_ext4_journal_size_bytes",
            "Size of the filesystem's internal journal, in bytes.",
            labels=["device", "mountpoint"],
        )
        for device, mountpoint, text, size in read:
            labels = [device, mountpoint]
            options = parse_options(text)
            if len(options) > MAX_OPTIONS:
                scrape.error(
                    f"{device}: {len(options)} options, only the first {MAX_OPTIONS} published",
                    "series_limit",
                    subject=f"{device} options count",
                    count=len(options) - MAX_OPTIONS,
                )
                options = options[:MAX_OPTIONS]
            present = {}
            for option, value in options:
                option_info.add_metric(labels + [option, value], 1)
                present[option] = value
            dioread_nolock.add_metric(labels, 1 if "dioread_nolock" in present else 0)
            delalloc.add_metric(labels, 0 if "nodelalloc" in present else 1)
            if "commit" in present:
                try:
                    commit.add_metric(labels, parse_uint(present["commit"], "commit"))
                except ParseError as e:
                    scrape.error(f"{device}: {e}", subject=f"{device} commit")
            fs = self._part[device] = {"mountpoint": mountpoint, "options": present}
            if size is not None:
                journal.add_metric(labels, size)
                fs["journal"] = size
        return option_info, dioread_nolock, delalloc, commit, journal

    @staticmethod
    def _mounts(scrape):
        """Kernel device name -> its first ext4 mount, matched by device number."""
        out = {}
        for m in scrape.mounts:
            if m.fstype == "ext4":
                name = scrape.name_of_devno(m.majmin)
                if name and name not in out:
                    out[name] = m
        return out
