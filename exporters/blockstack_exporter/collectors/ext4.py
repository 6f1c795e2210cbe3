"""ext4 effective mount options and journal size.

/proc/mounts does not show options that are defaults (dioread_nolock became one in 5.6 and
the ext4 incident hid behind it); /proc/fs/ext4/DEV/options lists every option in effect,
one per line (fs/ext4/super.c _ext4_show_options with the "show all" flag).
The journal size comes from the superblock: s_jnl_blocks[15..16] keep a copy of the journal
inode's i_size_high/i_size (fs/ext4/ext4.h, struct ext4_super_block; EXT3_JNL_BACKUP_BLOCKS).
Where /dev/DEV cannot be opened (a pod given the host's /proc but no devices), it is derived
from what procfs publishes instead: see journal_bytes_from_proc.
"""

import errno
import os
import re
import struct

from prometheus_client.core import GaugeMetricFamily

from ..fs import BlockingReads, ParseError, listdir, parse_uint, read_text
from ..scrape import Reuse, reason_of
from .jbd2 import parse_info

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


# errors opening /dev/DEV after which the journal size is derived from procfs: no device node
# (a pod), or one the exporter may not open (no CAP_DAC_OVERRIDE, not in group disk)
NO_DEVICE = (errno.ENOENT, errno.EACCES, errno.EPERM)
# jbd2 caps a transaction at a third of the journal from 6.11 on, at a quarter before
# (include/linux/jbd2.h jbd2_journal_get_max_txn_bufs: torvalds/linux a794c9ad026f "jbd2:
# increase maximum transaction size", merged for 6.11)
THIRD_SINCE = (6, 11)
ORDER_LINE = re.compile(r"^list_order_(\d+)_groups: \d+$", re.ASCII)
RELEASE = re.compile(r"^(\d+)\.(\d+)", re.ASCII)


def kernel_fraction(release):
    """The fraction of its journal a transaction may use on kernel `release` ("6.18.4-..."):
    3 from 6.11 on, 4 before; None when the release cannot be read."""
    m = RELEASE.match(release or "")
    if not m:
        return None
    return 3 if (int(m[1]), int(m[2])) >= THIRD_SINCE else 4


def parse_block_size(text):
    """The filesystem's block size from /proc/fs/ext4/DEV/mb_structs_summary (fs/ext4/mballoc.c
    ext4_mb_seq_structs_summary_show): under "max_free_order_lists:" one "list_order_K_groups: N"
    line per buddy order, MB_NUM_ORDERS(sb) = s_blocksize_bits + 2 of them (fs/ext4/mballoc.h),
    so the block size is 2 ** (lines - 2)."""
    orders, inside = 0, False
    for raw in text.splitlines():
        line = raw.strip()
        if not raw[:1].isspace():  # a section header: only max_free_order_lists is counted
            inside = line == "max_free_order_lists:"
            continue
        if inside:
            m = ORDER_LINE.match(line)
            if not m or int(m[1]) != orders:
                raise ParseError(f"mb_structs_summary: unexpected line {line[:80]!r}")
            orders += 1
    if not 12 <= orders <= 18:  # ext4 blocks are 1 KiB (10 bits) to 64 KiB (16 bits)
        raise ParseError(f"mb_structs_summary: {orders} buddy orders, not 12 to 18")
    return 1 << (orders - 2)


def journal_bytes_from_limits(max_blocks, block_size, fraction):
    """The journal's size from jbd2's cap on a transaction. The kernel sets the cap to
    (journal blocks - fast-commit blocks) // fraction (3 or 4), so the journal is fraction * cap
    blocks up to fraction - 1 more. mke2fs and tune2fs size journals in whole MiB (-J size= is in
    MiB, the defaults are 1024 * 2**k blocks): the answer is the whole-MiB size in that range.
    Both fractions are tried, so that a kernel whose release says otherwise (a backport) still
    gives its size; where both fit (a quarter of 64 MiB is a third of 48 MiB), `fraction`, the
    kernel release's, decides. A ParseError where none fits, or both and `fraction` is None.
    With a fast-commit area (mke2fs -O fast_commit) the kernel leaves it out first: the size
    found is then the main journal's, without the area the superblock's size includes."""
    mib = (1 << 20) // block_size  # blocks per MiB
    found = {}
    for f in (3, 4):
        low = max_blocks * f
        whole = -(-low // mib) * mib  # the first whole MiB at or above low
        if max_blocks > 0 and whole <= low + f - 1:
            found[f] = whole * block_size
    if len(found) == 2 and fraction in found:
        return found[fraction]
    if len(found) != 1:
        raise ParseError(
            f"a transaction cap of {max_blocks} blocks of {block_size} bytes fits "
            f"{len(found) or 'no'} whole-MiB journal sizes"
        )
    return found.popitem()[1]


def journal_bytes_from_proc(procfs, device, jbd2_names):
    """The journal's size without the device, from what procfs publishes: jbd2's cap on a
    transaction (the first line of /proc/fs/jbd2/DEV-INO/info), the block size
    (parse_block_size) and the kernel's release (kernel_fraction). A ParseError or OSError
    says why there is none: mb_structs_summary came with 5.13 (mb_optimize_scan), so a 5.10
    kernel gives no journal size this way; an external journal has no DEV-INO of DEV."""
    journals = [n for n in jbd2_names if n.rpartition("-")[0] == device]
    if len(journals) != 1:  # none: no journal, or an external one
        raise ParseError(f"{len(journals)} journals {device}-INO in /proc/fs/jbd2, not one")
    info = parse_info(read_text(os.path.join(procfs, "fs", "jbd2", journals[0], "info")))
    block_size = parse_block_size(
        read_text(os.path.join(procfs, "fs", "ext4", device, "mb_structs_summary"))
    )
    try:
        release = read_text(os.path.join(procfs, "sys", "kernel", "osrelease"))
    except OSError:
        release = None  # only a size that one fraction alone gives is taken
    return journal_bytes_from_limits(info["max_blocks"], block_size, kernel_fraction(release))


class Ext4Collector:
    """The journal's size cannot change while the filesystem is mounted (resizing a journal needs
    it unmounted), so the superblock is read once per mount (the mount ID of mountinfo), never
    on every scrape. That read goes to a device that may hang, or to whatever sits at /dev/DEV:
    it runs with the collector's deadline (fs.BlockingReads) and a stuck device costs its
    journal size alone."""

    name = "ext4"

    def __init__(self):
        self.reads = BlockingReads()
        # (device, mount id) -> (journal bytes or None (external journal), their source)
        self._journal = {}
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
        jbd2_names = []  # /proc/fs/jbd2's entries, listed once a superblock cannot be read
        # (device, mountpoint, options text, journal bytes or None, their source) of each filesystem
        read = []
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
            journal = self._journal.get(key) if key[1] is not None else None
            if key not in self._journal or key[1] is None:
                try:
                    journal = self._read_journal(scrape, device, jbd2_names)
                    if key[1] is not None:
                        journals[key] = journal
                except (OSError, ParseError) as e:  # the options are still published
                    scrape.error(
                        f"{device}: journal size: {e}",
                        reason_of(e),
                        subject=f"{device} journal size",
                    )
                    journal = (None, None)
            else:
                journals[key] = journal
            read.append((device, mount.mountpoint if mount else "", text) + journal)
        self._journal = journals  # only mounts still there are kept
        read = tuple(read)
        families = self._reuse.families_for(scrape, read, lambda: self._build(scrape, read))
        scrape.host.ext4 = self._part
        return families

    def _read_journal(self, scrape, device, jbd2_names):
        """(journal bytes or None, source) from the superblock on /dev/DEV; from procfs when there
        is no such device or it may not be opened (journal_bytes_from_proc). An error names both
        sources when neither gives a size."""
        try:
            sb = self.reads.pread(
                os.path.join(scrape.paths.dev, device), 1024, 1024, scrape.remaining()
            )
            return parse_superblock_journal_bytes(sb), "superblock"
        except OSError as e:
            if e.errno not in NO_DEVICE:
                raise
            no_device = e
        try:
            if not jbd2_names:
                jbd2_names.extend(listdir(os.path.join(scrape.paths.procfs, "fs", "jbd2")))
            size = journal_bytes_from_proc(scrape.paths.procfs, device, jbd2_names)
        except (OSError, ParseError) as e:
            # counted with the device's reason (vanished, unreadable): no size for want of it
            raise OSError(
                no_device.errno,
                f"{no_device.strerror}: {no_device.filename!r}; from procfs: {e}",
            ) from e
        return size, "derived from /proc/fs/jbd2"

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
        for device, mountpoint, text, size, source in read:
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
                fs["journal"], fs["journal_source"] = size, source
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
