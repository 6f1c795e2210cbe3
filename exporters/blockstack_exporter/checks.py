"""The table of checks: every block-stack misconfiguration the project names, in one place.

The exporter publishes the findings as blockstack_finding{device, check, severity} (the findings
collector) and `blockstack-doctor` prints them with their evidence and fixes; both evaluate
this table on the same Host, the values one scrape's collectors read, with the
thresholds of alerts/config.yml (knobs.py). A check that mirrors an alert names it and reads the
alert's knobs, so the doctor, the metric and the alert judge a setting alike
(tests/test_checks.py holds them to it).

Severities: critical (the data or the device's service is at stake now), warning (a setting
that makes the block layer do much worse than it can, on a device where it matters), info (a
setting worth knowing about; harmless until a workload meets it). The doctor exits 1 with a
finding at warning or above.

Some checks need more than a scrape reads: lvm.conf (the doctor's --path.lvmconf), two samples
(the doctor's --interval: COW fill rate, the live lineup) or ebpf_exporter's metrics (--ebpf).
The exporter evaluates the checks whose `needs` is "scrape".
"""

from .devices import layers
from .settings import (
    MAX_HW_SECTORS_KB,
    MAX_SECTORS_KB,
    NOMERGES,
    READ_AHEAD_KB,
    ROTATIONAL,
    SCHEDULER,
)

SEVERITIES = ("critical", "warning", "info")
KIB = 1024
SECTOR = 512

# Where a check's reasoning comes from, quoted in every finding.
NVME_WRITEUP = (
    "the LVM-snapshot-on-NVMe write-up (lvm-snapshot-nvme-merges.md): nvme1n1 had nomerges=2, "
    "dm-3 read 512-sector requests, nvme1n1 served them as 8-sector ones at 3000 r/s, 27x slower"
)
LVM2_WRITEUP = (
    "the lvm2 snapshot write-up (lvm2-snapshot-write-performance.txt): 1 GB dd on the origin took "
    "625 s with 4 KiB chunks, 200 s with 16 KiB, 49 s with 128-256 KiB (5 s without a snapshot)"
)
EXT4_WRITEUP = (
    "the ext4 dioread_nolock write-up (ext4-dioread-nolock-jbd2.txt): fsync-heavy 16 KiB writes fell "
    "from 20,026 to 315 IOPS, add_transaction_credits averaged 154 ms; a 1 GiB journal (was 128 MiB), "
    "dioread_lock or nodelalloc each fixed it"
)
QUEUE_DOC = "Documentation/ABI/stable/sysfs-block (queue/nomerges, queue/max_sectors_kb)"
KERNEL_READ_AHEAD = 128 * KIB  # include/linux/mm.h VM_READAHEAD_PAGES: a new device's read-ahead


class Finding:
    """persist is a line for a person; spec says what the persistent fix is, as data the doctor
    turns into recipes (persist.py: files, commands, checks) with what it reads of the host;
    recipes is that list, filled by the doctor (empty in the exporter, which needs none)."""

    __slots__ = (
        "check",
        "device",
        "severity",
        "what",
        "evidence",
        "fix",
        "persist",
        "why",
        "spec",
        "recipes",
    )

    def __init__(self, check, device, severity, what, evidence, fix, persist, why=None, spec=()):
        self.check, self.device, self.severity = check, device, severity
        self.what, self.evidence, self.fix, self.persist = what, list(evidence), fix, persist
        self.why, self.spec, self.recipes = why, list(spec), []

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__ if k != "spec"}


class Host:
    """What one scrape read, by device, as the collectors parsed it: each collector hands its part
    to the scrape (Scrape.host) with the families it built from the same values, so the findings
    cost no second read of sysfs, procfs or dmsetup, and nothing reads the exposition back. Sizes
    are in bytes, times in seconds. A part is shared with the scrapes that reuse it: never
    changed in place."""

    # what the collectors fill (the findings' reuse key); the rest is the doctor's
    PARTS = (
        "devices",
        "lower",
        "numbers",
        "queue",
        "targets",
        "snapshots",
        "pools",
        "crypt_flags",
        "ext4",
        "jbd2",
    )

    def __init__(self):
        # the stack collector: name -> {kind, name, uuid, vg_name, lv_name, lv_layer,
        # backing_file}, the labels of blockstack_device_info; name -> [devices directly beneath]
        self.devices = {}
        self.lower = {}
        self.numbers = {}  # name -> (major_minor, devno): its number now, as ebpf_exporter's devno
        # the queue collector: name -> {a setting's file (settings.py): its value, in base units;
        # "scheduler": the active one}; a file that could not be read is absent
        self.queue = {}
        # the dm collector, by dm-N: {target types}; {name, origin, cow, merge, chunk, used,
        # size, state}; {name, state, data_used, data_size, meta_used, meta_size}; {flags of its
        # crypt targets}
        self.targets = {}
        self.snapshots = {}
        self.pools = {}
        self.crypt_flags = {}
        # the ext4 collector: device -> {mountpoint, options {option: value}, journal}; the jbd2
        # collector: device -> {journal, phases {phase: seconds}, transactions}
        self.ext4 = {}
        self.jbd2 = {}
        # the doctor's: {setting: value} of lvm.conf; the first sample's Host and the seconds
        # between; {(metric, device): per-second rate} from ebpf_exporter; the interval's
        # lineup (lineup.lineup)
        self.lvm_conf = None
        self.previous, self.elapsed = None, None
        self.ebpf = None
        self.lineup = None

    # --- the stack ---------------------------------------------------------------------------
    def above(self, name):
        """Devices directly above name."""
        return sorted(d for d, lows in self.lower.items() if name in lows)

    def tops(self):
        """Devices nothing sits on: where each stack starts."""
        beneath = {low for lows in self.lower.values() for low in lows}
        return sorted(d for d in self.devices if d not in beneath)

    def layers(self, top):
        """top's stack as its layers, top down: [[top], [devices directly beneath], ...], each
        device once, in the first layer that reaches it (breadth first, cycle-safe)."""
        return layers(top, lambda d: self.lower.get(d, ()))

    def stack(self, top):
        """top and everything beneath it, top first, each once: layers() flattened."""
        return [d for layer in self.layers(top) for d in layer]

    def uppers(self, name):
        """Every device above name, nearest first."""
        return [d for layer in layers(name, self.above)[1:] for d in layer]

    def bottoms(self, name):
        """The devices at the bottom of name's stack (those with nothing beneath)."""
        return [d for d in self.stack(name) if not self.lower.get(d)]

    def label(self, name):
        """'dm-3 (vg/snap)' for an LVM volume, 'dm-5 (cryptroot)' for another dm device, else 'sda'."""
        info = self.devices.get(name, {})
        if info.get("vg_name") and info.get("lv_name"):
            layer = f" {info['lv_layer']} layer" if info.get("lv_layer") else ""
            return f"{name} ({info['vg_name']}/{info['lv_name']}{layer})"
        if info.get("kind") == "dm" and info.get("name") and info["name"] != name:
            return f"{name} ({info['name']})"
        return name

    def queue_owner(self, name):
        """A partition's settings are its disk's queue: the file to write is the disk's."""
        info = self.devices.get(name, {})
        if info.get("kind") == "partition" and self.lower.get(name):
            return self.lower[name][0]
        return name

    def resolve(self, spec):
        """A device given as dm-3, /dev/dm-3, /dev/mapper/vg-snap, vg-snap or vg/snap -> kernel name."""
        spec = spec.strip()
        for prefix in ("/dev/mapper/", "/dev/"):
            if spec.startswith(prefix):
                spec = spec[len(prefix) :]
        if spec in self.devices:
            return spec
        for name, info in self.devices.items():
            if spec in (info.get("name"), f"{info.get('vg_name')}/{info.get('lv_name')}"):
                return name
        return None


def _size(n):
    """Bytes as the kernel's files and LVM's tools write them: 4 KiB, 128 MiB, 1 GiB."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{int(n // factor)} {unit}"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{int(n)} bytes"


def _lv(host, name):
    """'vg/lv' for an LVM volume, else the dm name."""
    info = host.devices.get(name, {})
    if info.get("vg_name"):
        return f"{info['vg_name']}/{info['lv_name']}"
    return info.get("name") or name


def _udev(owner, attr, value):
    """The persist line without the host at hand (the doctor replaces it with persist.py's recipe,
    which matches the device by a stable identity)."""
    return (
        f'a udev rule /etc/udev/rules.d/90-blockstack-{owner}-{attr}.rules: ACTION=="add|change", '
        f'SUBSYSTEM=="block", <a stable match of {owner}>, ATTR{{queue/{attr}}}="{value}"'
    )


def udev_spec(owner, attr, value):
    """A queue attribute written by a udev rule on every add/change event of the device."""
    return [{"how": "udev", "device": owner, "attr": attr, "value": str(value)}]


def _in_file(owner, setting, value):
    """'/sys/block/sda/queue/max_sectors_kb = 4': a queue setting (a settings.py row) as its file
    reads it."""
    return f"/sys/block/{owner}/queue/{setting.file} = {setting.shown(value)}"


def queue_fix(owner, setting, value):
    """A Finding's fix, persist line and spec that write value (in base units; the scheduler's by
    name) to a queue setting (a settings.py row), now and by a udev rule."""
    text = setting.shown(value)
    return {
        "fix": f"echo {text} > /sys/block/{owner}/queue/{setting.file}",
        "persist": _udev(owner, setting.file, text),
        "spec": udev_spec(owner, setting.file, text),
    }


def lvm_spec(settings, monitor=(), clears=True):
    return [
        {"how": "lvm.conf", "settings": dict(settings), "monitor": list(monitor), "clears": clears}
    ]


# --- the checks ------------------------------------------------------------------------------


def nomerges_beneath_stack(host, k):
    """The alert's predicate: nomerges != 0 on a device that sits beneath another one."""
    beneath = {low for lows in host.lower.values() for low in lows}
    for name in sorted(beneath):
        value = host.queue.get(name, {}).get(NOMERGES.file)
        if not value:
            continue
        owner = host.queue_owner(name)
        above = ", ".join(host.label(d) for d in host.above(name))
        yield Finding(
            "nomerges_beneath_stack",
            name,
            "warning",
            f"merging restricted (nomerges={value:.0f}) beneath {above}",
            [
                _in_file(owner, NOMERGES, value) + " (0 all merges, 1 one-hit merges only, 2 none)",
                f"directly above {name}: {above}",
            ],
            **queue_fix(owner, NOMERGES, 0),
        )


def nomerges_elsewhere(host, k):
    """nomerges != 0 on a disk or a device nothing is stacked on (a partition's is its disk's)."""
    beneath = {low for lows in host.lower.values() for low in lows}
    for name in sorted(host.devices):
        value = host.queue.get(name, {}).get(NOMERGES.file)
        if not value or name in beneath or host.devices[name].get("kind") == "partition":
            continue
        mounted = (
            f"; ext4 mounted on it at {host.ext4[name]['mountpoint']}" if name in host.ext4 else ""
        )
        yield Finding(
            "nomerges",
            name,
            "info",
            f"merging restricted (nomerges={value:.0f}): sequential I/O submitted in small pieces "
            "reaches the driver unmerged",
            [_in_file(name, NOMERGES, value) + mounted],
            **queue_fix(name, NOMERGES, 0),
        )


def max_sectors_low(host, k):
    """The alert's predicate: max_sectors_kb < ratio * max_hw_sectors_kb and < the floor."""
    ratio, floor = k["max_sectors_max_ratio"], k["max_sectors_floor_bytes"]
    for name in sorted(host.queue):
        q = host.queue[name]
        cur, hw = q.get(MAX_SECTORS_KB.file), q.get(MAX_HW_SECTORS_KB.file)
        if cur is None or hw is None or not (cur < ratio * hw and cur < floor):
            continue
        owner = host.queue_owner(name)
        yield Finding(
            "max_sectors_low",
            name,
            "info",
            f"max_sectors_kb {cur / KIB:.0f} is far below the hardware's {hw / KIB:.0f}: every "
            "larger request is split",
            [
                _in_file(owner, MAX_SECTORS_KB, cur),
                _in_file(owner, MAX_HW_SECTORS_KB, hw),
                f"thresholds: below {ratio:g} x max_hw_sectors_kb and below {floor / KIB:.0f} KiB "
                "(alerts/config.yml)",
            ],
            **queue_fix(owner, MAX_SECTORS_KB, max_sectors_target(hw)),
        )


def max_sectors_target(hw):
    """The usual kernel default (BLK_DEF_MAX_SECTORS_CAP, 1280 KiB), within the hardware's limit."""
    return min(hw, 1280 * KIB)


def max_sectors_below_upper(host, k):
    """A dm or md device sends requests up to its own max_sectors_kb (stacked from its lowers'
    limits when its table was loaded); a lower lowered afterwards splits every one of them."""
    for upper in sorted(host.devices):
        if host.devices[upper].get("kind") not in ("dm", "md"):
            continue
        sends = host.queue.get(upper, {}).get(MAX_SECTORS_KB.file)
        for name in host.lower.get(upper, ()):
            q = host.queue.get(name, {})
            cur, hw = q.get(MAX_SECTORS_KB.file), q.get(MAX_HW_SECTORS_KB.file)
            if sends is None or cur is None or hw is None or not (cur < sends and cur < hw):
                continue
            owner = host.queue_owner(name)
            yield Finding(
                "max_sectors_below_upper",
                name,
                "info",
                f"max_sectors_kb {cur / KIB:.0f} is below the {sends / KIB:.0f} KiB requests "
                f"{host.label(upper)} sends it: each is split",
                [
                    _in_file(owner, MAX_SECTORS_KB, cur) + f" (max_hw_sectors_kb {hw / KIB:.0f})",
                    _in_file(upper, MAX_SECTORS_KB, sends),
                ],
                **queue_fix(owner, MAX_SECTORS_KB, min(sends, hw)),
            )


def read_ahead_below_lower(host, k):
    """A dm or md device reading ahead less than a device directly beneath it: sequential reads
    through it ask for less than the device beneath would read ahead on its own (an md array
    reads ahead two whole stripes; LVM's readahead "auto" gives a volume its PVs'). Left by
    blockdev --setra, lvchange -r or a tuned profile on the upper device."""
    for name in sorted(host.devices):
        if host.devices[name].get("kind") not in ("dm", "md"):
            continue
        mine = host.queue.get(name, {}).get(READ_AHEAD_KB.file)
        lower = {
            low: host.queue[low][READ_AHEAD_KB.file]
            for low in host.lower.get(name, ())
            if READ_AHEAD_KB.file in host.queue.get(low, {})
        }
        if mine is None or not lower or mine >= max(lower.values()):
            continue
        target = max(lower.values())
        evidence = [_in_file(name, READ_AHEAD_KB, mine)]
        evidence += [_in_file(host.queue_owner(low), READ_AHEAD_KB, v) for low, v in lower.items()]
        evidence.append(
            f"the kernel's default: {KERNEL_READ_AHEAD // KIB} KiB (VM_READAHEAD_PAGES)"
        )
        if host.devices[name].get("vg_name"):
            evidence.append(
                f"{_lv(host, name)} is an LVM volume: LVM sets its read-ahead when it activates "
                f"it; lvchange -r auto {_lv(host, name)} lets it take its PVs'"
            )
        yield Finding(
            "read_ahead_below_lower",
            name,
            "info",
            f"read-ahead {mine / KIB:.0f} KiB, below the {target / KIB:.0f} KiB of the device "
            "beneath: sequential reads through it are read ahead in smaller pieces",
            evidence,
            **queue_fix(name, READ_AHEAD_KB, target),
        )


def snapshot_chunk_small(host, k):
    """The alert's setting: chunk < snapshot_chunk_min_bytes (the alert also waits for writes
    to the origin, which the doctor sees with --interval)."""
    least, good = k["snapshot_chunk_min_bytes"], k["snapshot_chunk_good_bytes"]
    for name in sorted(host.snapshots):
        snap = host.snapshots[name]
        chunk = snap.get("chunk")
        if chunk is None or chunk >= least:
            continue
        lv = _lv(host, name)
        origin = snap.get("origin", "?")
        yield Finding(
            "snapshot_chunk_small",
            name,
            "info",
            f"snapshot chunks of {_size(chunk)}, below {_size(least)}: each first write to a chunk of the "
            f"origin waits for a synchronous copy of it",
            [
                f"dmsetup table {snap['name']}: chunk size {chunk / SECTOR:.0f} sectors ({_size(chunk)})",
                f"origin: {host.label(origin)}",
            ],
            f"a chunk size cannot change: once the snapshot's reader is done, lvremove {lv} and "
            f"lvcreate -s -c {good // KIB:.0f}k -L <COW size> -n {lv.split('/')[-1]} <VG/origin>",
            f"the recreated snapshot keeps its chunk size (on disk); give -c {good // KIB:.0f}k to lvcreate -s "
            "wherever snapshots are made (backup scripts)",
            spec=[
                {
                    "how": "snapshot",
                    "lv": lv,
                    "chunk_kib": int(good // KIB),
                    "cow_bytes": snap.get("size"),
                    "origin": _lv(host, origin) if origin in host.devices else "<VG/origin>",
                }
            ],
        )


def snapshot_invalid(host, k):
    for name in sorted(host.snapshots):
        snap = host.snapshots[name]
        if snap.get("state") not in ("invalid", "overflow", "merge_failed"):
            continue
        lv = _lv(host, name)
        severity = "critical"  # BlockStackSnapshotInvalid: invalid or overflow, the data is gone
        if snap["state"] == "merge_failed":
            severity = (
                "warning"  # the merge stopped; nothing is lost yet, and the alert does not page
            )
            what, fix = (
                "the merge of this snapshot into its origin failed",
                f"see the kernel log (dmesg | grep -i "
                f"snapshot), then lvchange --refresh {lv} to retry the merge",
            )
        else:
            what, fix = (
                f"snapshot {'invalidated' if snap['state'] == 'invalid' else 'overflowed'}: its data is "
                "lost (a full COW or an I/O error)",
                f"stop its readers, lvremove {lv}, recreate it with more COW space and rerun the backup",
            )
        yield Finding(
            "snapshot_invalid",
            name,
            severity,
            what,
            [f"dmsetup status {snap['name']}: {snap['state']}"],
            fix,
            "lvm.conf activation/snapshot_autoextend_threshold below 100 (dmeventd grows the COW), "
            "or a COW as large as the writes the origin takes while the snapshot lives",
            spec=lvm_spec(
                {"snapshot_autoextend_threshold": 70, "snapshot_autoextend_percent": 20},
                clears=False,
            ),
        )


def snapshot_cow_filling(host, k):
    """COW use from one scrape; with two samples (the doctor's --interval), the time to fill as
    BlockStackSnapshotCowFillingUp predicts it."""
    least, red = k["snapshot_fill_min_used_ratio"], k["snapshot_cow_used_warning_ratio"]
    horizon = k["snapshot_fill_horizon_seconds"]
    for name in sorted(host.snapshots):
        snap = host.snapshots[name]
        used, size = snap.get("used"), snap.get("size")
        if not size or used is None or snap.get("merge") or used / size < least:
            continue
        ratio = used / size
        evidence = [
            f"dmsetup status {snap['name']}: {used / SECTOR:.0f}/{size / SECTOR:.0f} sectors "
            f"({ratio:.0%} of {_size(size)})"
        ]
        severity = "warning" if ratio >= red else "info"
        before = host.previous.snapshots.get(name, {}) if host.previous else {}
        if host.elapsed and before.get("used") is not None:
            rate = (used - before["used"]) / host.elapsed
            if rate > 0:
                left = (size - used) / rate
                evidence.append(f"filling at {_size(rate)}/s: full in {left / 60:.0f} min")
                if left <= horizon:
                    severity = "warning"
            else:
                evidence.append(f"not growing over {host.elapsed:.0f} s")
        lv = _lv(host, name)
        yield Finding(
            "snapshot_cow_filling",
            name,
            severity,
            f"snapshot COW {ratio:.0%} used; a full COW invalidates the snapshot",
            evidence,
            f"lvextend -L +<size> {lv}, or lvremove {lv} once its reader is done",
            "lvm.conf activation/snapshot_autoextend_threshold = 70 and snapshot_autoextend_percent = 20 "
            "(dmeventd must monitor the snapshot)",
            spec=lvm_spec(
                {"snapshot_autoextend_threshold": 70, "snapshot_autoextend_percent": 20},
                [lv],
                clears=False,
            ),
        )


def thin_pool_full(host, k):
    """Data or metadata of a thin pool nearly full (dmeventd warns from 80 %, dmeventd(8)), or a
    pool out of space, read-only or failed."""
    most = k["thin_pool_used_max_ratio"]
    for name in sorted(host.pools):
        pool = host.pools[name]
        lv = _lv(host, name)
        state = pool.get("state")
        if state in ("out_of_data_space", "ro", "fail", "error"):
            yield Finding(
                "thin_pool_full",
                name,
                "critical",
                f"thin pool is {state}: writes to its thin volumes queue or fail",
                [f"dmsetup status {pool['name']}: {state}"],
                f"lvextend -L +<size> {lv} (data) or lvextend --poolmetadatasize +<size> {lv} (metadata); "
                "a failed pool needs lvconvert --repair",
                "lvm.conf activation/thin_pool_autoextend_threshold = 70, thin_pool_autoextend_percent = 20",
                spec=lvm_spec(
                    {"thin_pool_autoextend_threshold": 70, "thin_pool_autoextend_percent": 20},
                    [lv],
                    clears=False,
                ),
            )
            continue
        for what, used, size, grow in (
            ("data", pool.get("data_used"), pool.get("data_size"), "-L +<size>"),
            (
                "metadata",
                pool.get("meta_used"),
                pool.get("meta_size"),
                "--poolmetadatasize +<size>",
            ),
        ):
            if not size or used is None or used / size < most:
                continue
            yield Finding(
                "thin_pool_full",
                name,
                "warning",
                f"thin pool {what} {used / size:.0%} used (from {most:.0%}): when full, writes queue or fail",
                [f"dmsetup status {pool['name']}: {what} {_size(used)} of {_size(size)}"],
                f"lvextend {grow} {lv}",
                "lvm.conf activation/thin_pool_autoextend_threshold = 70, thin_pool_autoextend_percent = 20",
                spec=lvm_spec(
                    {"thin_pool_autoextend_threshold": 70, "thin_pool_autoextend_percent": 20},
                    [lv],
                    clears=False,
                ),
            )


def ext4_journal_small(host, k):
    """dioread_nolock (the default since 5.6) with a journal below the ext4 write-up's fix; a
    warning once handles wait for their transaction or, with ebpf_exporter, for credits as
    BlockStackJbd2CreditWaitHigh measures it. jbd2's "waiting for transaction" is, per
    transaction, the longest a handle waited for it to start (t_max_wait, fs/jbd2/transaction.c
    update_t_max_wait), averaged over the transactions since mount: a wait for the previous commit
    or for journal space. Older kernels fill it only with CONFIG_JBD2_DEBUG (it reads 0). It is
    a longest wait, so it errs towards warning; the eBPF figures are the alert's own: the
    average, the rate and the share of the waits that found the journal full."""
    good, wait_max = k["ext4_journal_good_bytes"], k["jbd2_credit_wait_max_seconds"]
    min_rate, min_full = k["jbd2_credit_wait_min_rate"], k["jbd2_checkpoint_wait_min_ratio"]
    for name in sorted(host.ext4):
        fs = host.ext4[name]
        journal = fs.get("journal")
        if (
            "dioread_nolock" not in fs["options"]
            or "nodelalloc" in fs["options"]
            or journal is None
            or journal >= good
        ):
            continue  # nodelalloc: ext4_should_dioread_nolock() is false without delayed allocation
        mnt = fs["mountpoint"] or "<mountpoint>"
        evidence = [
            f"/proc/fs/ext4/{name}/options: dioread_nolock (a default since 5.6, not in /proc/mounts)",
            f"journal {_size(journal)} ({fs.get('journal_source', 'superblock')}), below the "
            f"{_size(good)} that fixed the incident",
        ]
        severity = "info"
        j = host.jbd2.get(name)
        if j:
            waiting = j["phases"].get("waiting", 0.0)
            evidence.append(
                f"/proc/fs/jbd2/{j['journal']}/info: {j.get('transactions', 0):.0f} transactions, "
                f"the longest wait of a handle for its transaction averages {waiting * 1e3:.0f} ms"
            )
            if waiting > wait_max:
                severity = "warning"
        if host.ebpf is not None:
            rate = host.ebpf.get(("jbd2_credit_wait", name), 0.0)
            avg = host.ebpf.get(("jbd2_credit_wait_avg", name))
            full = host.ebpf.get(("jbd2_checkpoint_share", name), 0.0)
            if avg is not None:
                evidence.append(
                    f"ebpf: {rate:.0f} credit waits/s averaging {avg * 1e3:.2f} ms, "
                    f"{full:.2%} of them found the journal full"
                )
                if avg > wait_max and rate >= min_rate and full >= min_full:
                    severity = "warning"
        yield Finding(
            "ext4_journal_small",
            name,
            severity,
            f"ext4 on {name} runs dioread_nolock with a journal of {_size(journal)}: fsync-heavy writers "
            "wait for journal credits",
            evidence,
            f"mount -o remount,dioread_lock {mnt}",
            f"dioread_lock in /etc/fstab's options for {mnt}; or grow the journal, unmounted: "
            f"tune2fs -O ^has_journal /dev/{name} && tune2fs -J size={good >> 20:.0f} /dev/{name}",
            spec=[
                {
                    "how": "fstab",
                    "device": name,
                    "mountpoint": fs["mountpoint"],
                    "add": "dioread_lock",
                    "drop": "dioread_nolock",
                },
                {
                    "how": "journal",
                    "device": name,
                    "mountpoint": fs["mountpoint"],
                    "size_mib": int(good >> 20),
                },
            ],
        )


def scheduler_mismatch(host, k):
    """A disk's scheduler against its kind: none on a rotational disk gives up sorting and
    merging in the scheduler (Documentation/block/blk-mq.rst: none suits devices without a seek
    penalty); bfq on a non-rotational disk costs CPU per request that fast devices feel
    (Documentation/block/bfq-iosched.rst)."""
    for name in sorted(host.devices):
        if host.devices[name].get("kind") != "disk":
            continue  # partitions share their disk's queue; dm is bio-based; a loop device's backing decides
        q = host.queue.get(name, {})
        sched, rot = q.get(SCHEDULER.file), q.get(ROTATIONAL.file)
        if rot == 1 and sched == "none":
            advice, better = (
                "a rotational disk without an I/O scheduler: requests are neither sorted nor merged "
                "in a scheduler",
                "mq-deadline",
            )
        elif rot == 0 and sched == "bfq":
            advice, better = (
                "bfq on a non-rotational disk: its per-request work caps fast devices",
                "none",
            )
        else:
            continue
        yield Finding(
            "scheduler_mismatch",
            name,
            "info",
            advice,
            [
                f"/sys/block/{name}/queue/scheduler: [{sched}]",
                _in_file(name, ROTATIONAL, rot),
            ],
            **queue_fix(name, SCHEDULER, better),
        )


def crypt_workqueue(host, k):
    """dm-crypt over non-rotational disks without no_read_workqueue/no_write_workqueue (5.9+):
    every bio takes two trips through kcryptd workqueues, which costs fast devices latency and
    throughput (commit 39d42fa96ba1, Cloudflare's "Speeding up Linux disk encryption")."""
    for name in sorted(host.targets):
        if "crypt" not in host.targets[name]:
            continue
        bottoms = host.bottoms(name)
        if not bottoms or any(host.queue.get(b, {}).get(ROTATIONAL.file) != 0 for b in bottoms):
            continue
        flags = host.crypt_flags.get(name, set())
        missing = [f for f in ("no_read_workqueue", "no_write_workqueue") if f not in flags]
        if not missing:
            continue
        dm_name = host.devices.get(name, {}).get("name") or name
        yield Finding(
            "crypt_workqueue",
            name,
            "info",
            f"dm-crypt over non-rotational {', '.join(bottoms)} without {' and '.join(missing)}",
            [
                f"dmsetup table {dm_name}: flags {' '.join(sorted(flags)) or '(none)'}",
                f"beneath it: {', '.join(f'{b} (rotational 0)' for b in bottoms)}",
            ],
            f"cryptsetup refresh --perf-no_read_workqueue --perf-no_write_workqueue {dm_name}",
            f"cryptsetup refresh --persistent --perf-no_read_workqueue --perf-no_write_workqueue {dm_name} "
            "(LUKS2), or no-read-workqueue,no-write-workqueue in /etc/crypttab",
            spec=[{"how": "crypt", "name": dm_name}],
        )


def merge_collapse(host, k):
    """The collapse judged on the doctor's interval: collapse.py, which builds on this module."""
    from .collapse import merge_collapse as judge  # here, not at the top: collapse.py imports this

    return judge(host, k)


def lvm_autoextend_off(host, k):
    """Classic snapshots or thin pools while lvm.conf leaves autoextend off (threshold 100, the
    shipped default: lvm.conf(5))."""
    if host.lvm_conf is None:
        return
    for kind, setting, devices in (
        (
            "snapshot",
            "snapshot_autoextend_threshold",
            [d for d in host.snapshots if not host.snapshots[d].get("merge")],
        ),
        ("thin pool", "thin_pool_autoextend_threshold", list(host.pools)),
    ):
        value = host.lvm_conf.get(setting, 100)
        if not devices or value < 100:
            continue
        for name in sorted(devices):
            yield Finding(
                "lvm_autoextend_off",
                name,
                "info",
                f"{kind} autoextend is off: nothing grows it before it fills",
                [
                    f"lvm.conf activation/{setting} = {value:g}"
                    + ("" if setting in host.lvm_conf else " (not set: the default)")
                ],
                f"lvextend -L +<size> {_lv(host, name)} when needed",
                f"lvm.conf: activation {{ {setting} = 70 }} and {setting.replace('threshold', 'percent')} = 20; "
                "dmeventd must monitor the volume (lvchange --monitor y)",
                spec=lvm_spec(
                    {setting: 70, setting.replace("threshold", "percent"): 20}, [_lv(host, name)]
                ),
            )


class Check:
    """A row of the table: run(host, knobs) yields its findings; doc says when it finds, for
    docs/metrics.md's table of checks (`make metrics-doc`), with the severities it gives."""

    __slots__ = ("id", "run", "needs", "alert", "knobs", "source", "title", "severities", "doc")

    def __init__(
        self,
        id,
        run,
        title,
        source,
        needs="scrape",
        alert=None,
        knobs=(),
        severities=("info",),
        doc="",
    ):
        self.id, self.run, self.title, self.source = id, run, title, source
        self.needs, self.alert, self.knobs = needs, alert, tuple(knobs)
        self.severities, self.doc = tuple(severities), doc


CHECKS = (
    Check(
        "snapshot_invalid",
        snapshot_invalid,
        "classic snapshot invalid, overflowed or merge failed",
        "Documentation/admin-guide/device-mapper/snapshot.rst and drivers/md/dm-snap.c (Invalid, Overflow, "
        "Merge failed); dmeventd(8): a snapshot that runs out of space becomes invalid",
        alert="BlockStackSnapshotInvalid",
        severities=("critical", "warning"),
        doc=(
            "a classic snapshot Invalid or Overflow (critical: its data is gone), or Merge failed "
            "(warning); the alert pages on the critical ones"
        ),
    ),
    Check(
        "thin_pool_full",
        thin_pool_full,
        "thin pool data or metadata nearly full, or out of space",
        "lvmthin(7) and dmeventd(8): dmeventd warns from 80 % data or metadata use",
        knobs=("thin_pool_used_max_ratio",),
        severities=("warning", "critical"),
        doc=(
            "thin-pool data or metadata ≥ `thin_pool_used_max_ratio` (80 %, dmeventd's first "
            "warning); critical when out of data space, read-only or failed"
        ),
    ),
    Check(
        "nomerges_beneath_stack",
        nomerges_beneath_stack,
        "merging restricted beneath a stack",
        NVME_WRITEUP + "; " + QUEUE_DOC,
        alert="BlockStackNomergesBeneathStack",
        severities=("warning",),
        doc="`nomerges` ≠ 0 on a device something sits on",
    ),
    Check(
        "snapshot_cow_filling",
        snapshot_cow_filling,
        "classic snapshot COW filling",
        "Documentation/admin-guide/device-mapper/snapshot.rst (a full COW invalidates the snapshot)",
        alert="BlockStackSnapshotCowFillingUp",
        knobs=(
            "snapshot_fill_min_used_ratio",
            "snapshot_cow_used_warning_ratio",
            "snapshot_fill_horizon_seconds",
        ),
        severities=("info", "warning"),
        doc=(
            "COW ≥ `snapshot_fill_min_used_ratio` used; warning from "
            "`snapshot_cow_used_warning_ratio`, or (`--interval`) predicted full within "
            "`snapshot_fill_horizon_seconds`"
        ),
    ),
    Check(
        "ext4_journal_small",
        ext4_journal_small,
        "ext4 dioread_nolock with a small journal",
        EXT4_WRITEUP,
        alert="BlockStackJbd2CreditWaitHigh",
        knobs=(
            "ext4_journal_good_bytes",
            "jbd2_credit_wait_max_seconds",
            "jbd2_credit_wait_min_rate",
            "jbd2_checkpoint_wait_min_ratio",
        ),
        severities=("info", "warning"),
        doc=(
            "`dioread_nolock` in effect (`/proc/fs/ext4/DEV/options`, without `nodelalloc`, which "
            "turns it off) with a journal below `ext4_journal_good_bytes`; warning once jbd2 shows "
            "handles waiting for their transaction over `jbd2_credit_wait_max_seconds` (or, with "
            "`--ebpf`, the alert's own credit-wait average and rate, and the share of the waits "
            "that found the journal full)"
        ),
    ),
    Check(
        "max_sectors_low",
        max_sectors_low,
        "max_sectors_kb far below the hardware limit",
        QUEUE_DOC
        + "; the loop lab: max_sectors_kb=4 turns 1024-sector requests into 8-sector ones",
        alert="BlockStackMaxSectorsLow",
        knobs=("max_sectors_max_ratio", "max_sectors_floor_bytes"),
        doc=(
            "`max_sectors_kb` < `max_sectors_max_ratio` × `max_hw_sectors_kb` and < "
            "`max_sectors_floor_bytes`"
        ),
    ),
    Check(
        "max_sectors_below_upper",
        max_sectors_below_upper,
        "max_sectors_kb below what the layer above sends",
        "Documentation/admin-guide/device-mapper: a dm device's limits are stacked from its lowers' when "
        "its table is loaded, a later change beneath is not seen above; " + QUEUE_DOC,
        doc=(
            "a device's `max_sectors_kb` below the requests the dm/md device above it sends "
            "(limits are stacked when a table loads; a later change beneath splits every request)"
        ),
    ),
    Check(
        "read_ahead_below_lower",
        read_ahead_below_lower,
        "dm or md read-ahead below the device beneath",
        "Documentation/ABI/stable/sysfs-block (queue/read_ahead_kb); include/linux/mm.h "
        "VM_READAHEAD_PAGES (128 KiB, a new device's read-ahead); drivers/md/raid5.c and "
        "raid10.c: an md array reads ahead at least twice a whole stripe; lvm.conf(5) "
        "activation/readahead and lvchange(8) -r, lvm2 test/shell/read-ahead.sh: a volume's "
        "read-ahead is inherited from its PVs",
        doc=(
            "a dm or md device's `read_ahead_kb` below that of a device directly beneath it "
            "(`blockdev --setra`, `lvchange -r` or a tuned profile on the upper device)"
        ),
    ),
    Check(
        "snapshot_chunk_small",
        snapshot_chunk_small,
        "classic snapshot chunk size small",
        LVM2_WRITEUP,
        alert="BlockStackSnapshotChunkSmall",
        knobs=("snapshot_chunk_min_bytes", "snapshot_chunk_good_bytes"),
        doc=(
            "snapshot chunk < `snapshot_chunk_min_bytes` (the lvm2 write-up's table); the alert "
            "also waits for writes to the origin"
        ),
    ),
    Check(
        "nomerges",
        nomerges_elsewhere,
        "merging restricted",
        QUEUE_DOC + "; " + NVME_WRITEUP,
        doc="`nomerges` ≠ 0 on a device nothing is stacked on",
    ),
    Check(
        "scheduler_mismatch",
        scheduler_mismatch,
        "I/O scheduler unsuited to the device",
        "Documentation/block/blk-mq.rst, Documentation/block/bfq-iosched.rst",
        doc="a rotational disk without a scheduler, or bfq on a non-rotational one",
    ),
    Check(
        "crypt_workqueue",
        crypt_workqueue,
        "dm-crypt on fast devices without the workqueue bypass",
        "Documentation/admin-guide/device-mapper/dm-crypt.rst (no_read_workqueue, no_write_workqueue, 5.9+); "
        "commit 39d42fa96ba1 and Cloudflare's 'Speeding up Linux disk encryption' (2020)",
        doc=(
            "dm-crypt over non-rotational disks without `no_read_workqueue`/`no_write_workqueue` "
            "(5.9+)"
        ),
    ),
    Check(
        "lvm_autoextend_off",
        lvm_autoextend_off,
        "LVM autoextend off for snapshots or thin pools",
        "lvm.conf(5): snapshot_autoextend_threshold / thin_pool_autoextend_threshold 100 disables it",
        needs="lvm.conf",
        doc=(
            "classic snapshots or thin pools while lvm.conf's `*_autoextend_threshold` is 100 (the "
            "default: off); doctor only"
        ),
    ),
    Check(
        "merge_collapse",
        merge_collapse,
        "merge collapse over the interval",
        NVME_WRITEUP,
        needs="interval",
        alert="BlockStackMergeCollapse",
        severities=("critical", "warning", "info"),
        doc=(
            "`--interval` only, judged as the collapse rules judge it: critical on the page's "
            "evidence, counted on the device's own requests by ebpf_exporter (`--ebpf`: merging "
            "refused, or requests split into tiny pieces); warning, without `--ebpf`, for requests "
            "cut at a max_sectors_kb below the floor (diskstats: tiny requests at a real rate, each "
            "as large as the limit allows: the split the page names, seen without its counter); "
            "info for the layered shape alone (small requests where they reach a driver beneath a "
            "device sending large ones: the dashboard's context, and another tenant's small I/O on "
            "a shared disk looks the same)"
        ),
    ),
)
BY_ID = {c.id: c for c in CHECKS}
KNOBS = sorted({knob for c in CHECKS for knob in c.knobs})


def evaluate(host, knobs, needs=("scrape", "lvm.conf"), failed=None):
    """Every finding of the checks whose inputs are at hand, most severe first, then by check
    order and device. A check that raises costs its own findings only: (check, exception) is
    appended to `failed`."""
    order = {c.id: i for i, c in enumerate(CHECKS)}
    findings = []
    for check in CHECKS:
        if check.needs in needs:
            try:
                mine = list(check.run(host, knobs))
            except Exception as e:  # noqa: BLE001 - one check's bug must not hide the others' findings
                if failed is not None:
                    failed.append((check.id, e))
                continue
            for f in mine:
                f.why = check.source
                findings.append(f)
    findings.sort(key=lambda f: (SEVERITIES.index(f.severity), order[f.check], f.device))
    return findings
