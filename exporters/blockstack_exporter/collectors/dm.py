"""device-mapper tables and status, read through device-mapper itself with `dmsetup`.

Two commands per scrape, and only when sysfs shows dm devices (the second only when the
table has a snapshot, snapshot-merge or thin-pool target):

    dmsetup table                 NAME: START LENGTH TARGET ARGS...   (one line per target)
    dmsetup status --noflush      NAME: START LENGTH TARGET STATUS...

When `dmsetup table` fails or runs out of time (a loaded host, a slow root filesystem) while
sysfs shows the same dm devices as at its last success, that table stands in, so that the
snapshot's facts do not blink out; the failure is still counted. `dmsetup status` (COW and pool
use) is never stood in for: a stale use would hide a snapshot filling.

Without a device argument dmsetup prefixes every line with the (mangled) device name. `--noflush`
keeps the status call from committing thin-pool metadata on every scrape (dm-thin.c pool_status
commits unless DM_STATUS_NOFLUSH_FLAG is set); the numbers are at most one commit period old.
dmsetup prints device numbers as MAJ:MIN (the kernel's format_dev_t); they are mapped to kernel
names through /sys/dev/block, dm names to dm-N through /sys/block/dm-N/dm/name. `lvs` is never run:
it takes LVM's locks and scans every PV, and a scrape must not.

With --collector.dm.helper SOCKET the exporter holds no capability: it asks the helper
(dm_helper.py, the only holder of CAP_SYS_ADMIN, which the DM ioctls need) for one of the two
listings by name ("table" or "status"), and the helper runs dmsetup with exactly these arguments.

Formats, from the kernel:
- snapshot / snapshot-merge table (Documentation/admin-guide/device-mapper/snapshot.rst):
      <origin> <COW device> <P|PO|N> <chunksize sectors> [<#feature args> [<arg>]*]
  status (drivers/md/dm-snap.c snapshot_status), one of:
      <sectors_allocated>/<total_sectors> <metadata_sectors>   (metadata absent before 2.6.33)
      Invalid | Merge failed | Overflow | Unknown
  sectors_allocated and total_sectors both include the metadata (dm-snap-persistent.c
  persistent_usage); a transient (N) store reports 0 metadata. A merge is done when
  sectors_allocated == metadata_sectors.
- snapshot-origin table: <origin>; status: empty.
- thin-pool table (Documentation/admin-guide/device-mapper/thin-provisioning.rst):
      <metadata dev> <data dev> <data block size sectors> <low water mark> [<#features> <arg>...]
  status (dm-thin.c pool_status):
      <transaction id> <used meta>/<total meta> <used data>/<total data> <held root|->
      [ro|rw|out_of_data_space] [[no_]discard_passdown|ignore_discard]
      [error|queue]_if_no_space [needs_check|-] [<metadata low watermark>]
  or just `Fail` / `Error`. Metadata blocks are 4 KiB (THIN_METADATA_BLOCK_SIZE); data blocks
  are the table's data block size.
Every other target (linear, thin, raid, crypt, ...) is published as blockstack_dm_target_info only;
its arguments are never logged or exported (a crypt table can carry a key).
"""

import logging
import os
import re
import selectors
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily

from ..fs import ParseError, TooLarge, parse_uint
from ..scrape import CollectorFailed, Reuse

log = logging.getLogger("blockstack_exporter")

SECTOR = 512
THIN_METADATA_BLOCK = 4096  # drivers/md/dm-thin-metadata.h THIN_METADATA_BLOCK_SIZE
SNAPSHOT_STATES = ("valid", "invalid", "overflow", "merge_failed", "merging")
THIN_POOL_STATES = ("rw", "ro", "out_of_data_space", "fail", "error")
TABLE_ARGS = ("table",)
STATUS_ARGS = ("status", "--noflush")
# The whole interface of the privileged helper (dm_helper.py): a request names one of these.
REQUESTS = {"table": TABLE_ARGS, "status": STATUS_ARGS}
REASONS = (
    "command",
    "timeout",
    "too_large",
    "deadline",
)  # the DmsetupError reasons a helper may answer
MISSING = object()  # the status call failed: already reported once
KILL_GRACE = 1.0  # seconds to reap a killed dmsetup before abandoning it (stuck in an ioctl)
MAX_OUTPUT_BYTES = 8 << 20  # dmsetup's output for ~50k targets; beyond, it is not dmsetup talking
MAX_STDERR_BYTES = 4096

_LINE = re.compile(
    r"^(\S+?):(?: +(\d+) +(\d+) +(\S+)(?: (.*))?)? *$", re.ASCII
)  # mangled names hold no spaces
_DEVNO = re.compile(r"^\d+:\d+$", re.ASCII)
_MANGLED = re.compile(r"\\x([0-9a-fA-F]{2})")


class DmsetupError(Exception):
    """dmsetup could not be run, failed, or timed out."""

    def __init__(self, message, reason="command"):
        super().__init__(message)
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# Parsers: pure functions of text, raising only ParseError.
# ---------------------------------------------------------------------------------------------


class Target:
    __slots__ = ("name", "start", "length", "target", "params")

    def __init__(self, name, start, length, target, params):
        self.name, self.start, self.length, self.target, self.params = (
            name,
            start,
            length,
            target,
            params,
        )

    def __repr__(self):
        return f"Target({self.name!r}, {self.start}, {self.length}, {self.target!r})"


def unmangle(name):
    """dmsetup's default --manglename auto prints characters outside its whitelist as \\xNN."""
    if "\\x" not in name:
        return name
    return _MANGLED.sub(lambda m: chr(int(m.group(1), 16)), name)


def parse_line(line):
    """'vg-lv: 0 2097152 linear 8:19 384' -> Target; 'vg-lv:' (no table loaded) -> None target.

    Raises ParseError on anything else. The message never quotes the line: a crypt table line
    may hold a key."""
    m = _LINE.match(line)
    if not m:
        raise ParseError(f"unparseable line ({len(line)} characters)")
    name = unmangle(m.group(1))
    if m.group(2) is None:
        return Target(name, None, None, None, "")
    return Target(
        name,
        parse_uint(m.group(2), "start"),
        parse_uint(m.group(3), "length"),
        m.group(4),
        m.group(5) or "",
    )


def parse_listing(text):
    """All lines of `dmsetup table`/`status` output -> ([Target], [(line number, ParseError)])."""
    targets, errors = [], []
    if text.strip() == "No devices found":
        return targets, errors
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            targets.append(parse_line(line))
        except ParseError as e:
            errors.append((number, e))
    return targets, errors


def _int(word, what):
    return parse_uint(word, what)


def _devno(word, what):
    if not _DEVNO.match(word) or not word.isascii():
        raise ParseError(f"{what}: expected MAJ:MIN, got {word[:40]!r}")
    return word


def _fraction(word, what):
    used, sep, total = word.partition("/")
    if not sep:
        raise ParseError(f"{what}: expected USED/TOTAL, got {word[:40]!r}")
    return _int(used, what), _int(total, what)


def _features(words, target):
    """The optional `<#feature args> [<arg>]*` after a table's four fixed arguments."""
    if len(words) <= 4:
        return []
    count, features = _int(words[4], f"{target} feature count"), words[5:]
    if count != len(features):
        raise ParseError(
            f"{target} table: {count} feature arguments announced, {len(features)} given"
        )
    return features


def parse_snapshot_table(params):
    """-> {origin, cow, persistent ('P'|'PO'|'N'), chunk_sectors, features [..]}."""
    words = params.split()
    if len(words) < 4:
        raise ParseError(f"snapshot table: expected 4 or more arguments, got {len(words)}")
    store = words[2].upper()
    if store not in ("P", "PO", "N"):
        raise ParseError(f"snapshot table: persistence is not P, PO or N: {words[2][:10]!r}")
    return {
        "origin": _devno(words[0], "snapshot origin"),
        "cow": _devno(words[1], "snapshot cow"),
        "persistent": store,
        "chunk_sectors": _int(words[3], "snapshot chunk size"),
        "features": _features(words, "snapshot"),
    }


def parse_snapshot_status(params):
    """-> {state, used_sectors, total_sectors, metadata_sectors}; numbers are None when not reported.

    state is the kernel's word mapped to valid|invalid|overflow|merge_failed ("Unknown", a store
    without a usage function, counts as valid). A newer kernel may append a cause to Invalid."""
    text = params.strip()
    out = {"state": "valid", "used_sectors": None, "total_sectors": None, "metadata_sectors": None}
    if text == "Invalid" or text.startswith("Invalid "):
        out["state"] = "invalid"
    elif text == "Merge failed":
        out["state"] = "merge_failed"
    elif text == "Overflow":
        out["state"] = "overflow"
    elif text == "Unknown":
        pass
    else:
        words = text.split()
        if len(words) not in (1, 2):
            raise ParseError(f"snapshot status: unexpected {text[:60]!r}")
        used, total = _fraction(words[0], "snapshot status")
        out["used_sectors"], out["total_sectors"] = used, total
        if len(words) == 2:
            out["metadata_sectors"] = _int(words[1], "snapshot metadata sectors")
    return out


# dm-crypt's optional parameters that are flags (Documentation/admin-guide/device-mapper/dm-crypt.rst):
# only these words are taken from a crypt table, which also holds the key (never kept or logged).
CRYPT_FLAGS = frozenset(
    (
        "allow_discards",
        "same_cpu_crypt",
        "submit_from_crypt_cpus",
        "no_read_workqueue",
        "no_write_workqueue",
        "iv_large_sectors",
    )
)


def crypt_flags(params):
    """The flags among a crypt table's optional parameters:
    <cipher> <key> <iv_offset> <device path> <offset> [<#opt_params> <opt_params>]."""
    return CRYPT_FLAGS.intersection(params.split()[5:])


def parse_origin_table(params):
    words = params.split()
    if len(words) != 1:
        raise ParseError(f"snapshot-origin table: expected 1 argument, got {len(words)}")
    return _devno(words[0], "snapshot-origin origin")


def parse_thin_pool_table(params):
    """-> {metadata_dev, data_dev, data_block_sectors, low_water_mark, features [..]}."""
    words = params.split()
    if len(words) < 4:
        raise ParseError(f"thin-pool table: expected 4 or more arguments, got {len(words)}")
    block = _int(words[2], "thin-pool data block size")
    if block == 0:
        raise ParseError("thin-pool table: data block size 0")
    return {
        "metadata_dev": _devno(words[0], "thin-pool metadata device"),
        "data_dev": _devno(words[1], "thin-pool data device"),
        "data_block_sectors": block,
        "low_water_mark": _int(words[3], "thin-pool low water mark"),
        "features": _features(words, "thin-pool"),
    }


def parse_thin_pool_status(params):
    """-> {failed: None|'Fail'|'Error', transaction_id, used/total metadata and data blocks,
    held_root, mode, needs_check}. Fields newer kernels added are optional."""
    words = params.split()
    if words in (["Fail"], ["Error"]):
        return {"failed": words[0]}
    if len(words) < 4:
        raise ParseError(f"thin-pool status: expected 4 or more fields, got {len(words)}")
    used_meta, total_meta = _fraction(words[1], "thin-pool metadata blocks")
    used_data, total_data = _fraction(words[2], "thin-pool data blocks")
    out = {
        "failed": None,
        "transaction_id": _int(words[0], "thin-pool transaction id"),
        "used_metadata_blocks": used_meta,
        "total_metadata_blocks": total_meta,
        "used_data_blocks": used_data,
        "total_data_blocks": total_data,
        "held_root": None if words[3] == "-" else _int(words[3], "thin-pool held root"),
        "mode": None,
        "needs_check": False,
    }
    for w in words[4:]:
        if w in ("rw", "ro", "out_of_data_space"):
            out["mode"] = w
        elif w == "needs_check":
            out["needs_check"] = True
    return out


# ---------------------------------------------------------------------------------------------
# Running dmsetup
# ---------------------------------------------------------------------------------------------


def _stderr(data):
    """dmsetup's complaint on one line: '/dev/mapper/control: open failed: ...; Command failed.'"""
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return "; ".join(lines)[:300]


@dataclass
class DmRead:
    """What one reading of the tables and status found, by kernel name (dm-N), for the checks
    (checks.Host): sizes in bytes, states as the families' state labels."""

    targets: dict = field(default_factory=dict)  # {target types}
    snapshots: dict = field(
        default_factory=dict
    )  # {name, origin, cow, merge, chunk, used, size, state}
    pools: dict = field(
        default_factory=dict
    )  # {name, state, data_used, data_size, meta_used, meta_size}
    crypt_flags: dict = field(default_factory=dict)  # the performance flags of its crypt targets


class DmCollector:
    name = "dm"

    def __init__(self, dmsetup="dmsetup", timeout=5.0, helper=None, preexec_fn=None):
        """helper: the Unix socket of dm_helper.py, asked instead of running dmsetup here.
        preexec_fn: run in the dmsetup child before exec (dm_helper.py: its capability)."""
        self.dmsetup, self.timeout, self.helper, self.preexec_fn = (
            dmsetup,
            timeout,
            helper,
            preexec_fn,
        )
        self._abandoned = []  # dmsetup processes that did not die when killed (stuck in an ioctl)
        # worth 25 % of a 1024-device scrape's CPU (make bench-exporter --without reuse-dm)
        self._reuse = Reuse()
        self._part = DmRead()  # the Host's part, of the families built last
        self._table = (
            None  # (the dm devices as sysfs showed them, `dmsetup table`) of the last table read
        )

    def run(self, args, timeout=None):
        """stdout of `dmsetup ARGS` as text; DmsetupError if absent, failing, slower than the
        timeout (the flag's, or less: the collector's deadline) or writing more than
        MAX_OUTPUT_BYTES.

        dmsetup runs in its own session so that a timeout kills it and anything it started."""
        self._reap()
        timeout = self.timeout if timeout is None else min(self.timeout, timeout)
        command = f"`dmsetup {' '.join(args)}`"
        if timeout <= 0:
            raise DmsetupError(
                f"{command} not run: the collector's deadline has passed", "deadline"
            )
        if self.helper:
            return self._ask(args, timeout, command)
        argv = [self.dmsetup, *args]
        env = dict(os.environ, LC_ALL="C")
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=env,
                preexec_fn=self.preexec_fn,
            )
        except OSError as e:
            raise DmsetupError(f"cannot run {self.dmsetup}: {e.strerror or e}") from None
        try:
            out, err = self._read(proc, time.monotonic() + timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            raise DmsetupError(
                f"{command} timed out after {timeout:.2g}s; killed", "timeout"
            ) from None
        except TooLarge:
            self._kill(proc)
            raise DmsetupError(
                f"{command} wrote more than {MAX_OUTPUT_BYTES} bytes; killed", "too_large"
            ) from None
        if proc.wait() != 0:
            raise DmsetupError(f"{command} exited with {proc.returncode}: {_stderr(err)}")
        return out.decode("utf-8", "replace")

    def _ask(self, args, timeout, command):
        """The helper's answer to the request naming args: "ok\n" and dmsetup's output, or
        "error REASON\n" and its message (dm_helper.py). Helper down, refused or mute: DmsetupError."""
        word = next(w for w, a in REQUESTS.items() if a == tuple(args))
        deadline = time.monotonic() + timeout
        reply = bytearray()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(self.helper)
                s.sendall(word.encode() + b"\n")
                while chunk := s.recv(1 << 16):
                    reply += chunk
                    if len(reply) > MAX_OUTPUT_BYTES + MAX_STDERR_BYTES:
                        raise DmsetupError(
                            f"{command}: the helper wrote more than {MAX_OUTPUT_BYTES} bytes",
                            "too_large",
                        )
                    s.settimeout(max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise DmsetupError(
                f"{command}: no answer from the dm helper {self.helper} in {timeout:.2g}s",
                "timeout",
            ) from None
        except OSError as e:
            raise DmsetupError(f"{command}: dm helper {self.helper}: {e.strerror or e}") from None
        head, _, body = bytes(reply).partition(b"\n")
        if head == b"ok":
            return body.decode("utf-8", "replace")
        if not head.startswith(b"error "):
            raise DmsetupError(
                f"{command}: unexpected answer from the dm helper ({len(reply)} bytes)"
            )
        reason = head.removeprefix(b"error ").decode("ascii", "replace")
        raise DmsetupError(
            _stderr(body) or f"{command} failed in the dm helper",
            reason if reason in REASONS else "command",
        )

    @staticmethod
    def _read(proc, deadline):
        """Both pipes to end of file, stdout bounded, stderr kept up to MAX_STDERR_BYTES."""
        out, err = bytearray(), bytearray()
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(proc.args, 0)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
                    elif key.data is out:
                        out += chunk
                        if len(out) > MAX_OUTPUT_BYTES:
                            raise TooLarge("dmsetup output")
                    elif len(err) < MAX_STDERR_BYTES:
                        err += chunk[: MAX_STDERR_BYTES - len(err)]
        left = deadline - time.monotonic()
        try:
            proc.wait(max(left, 0.01))
        except subprocess.TimeoutExpired:
            raise
        return bytes(out), bytes(err)

    def _kill(self, proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.communicate(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            # Uninterruptible sleep: the kill lands when the ioctl returns. Do not wait for it.
            for pipe in (proc.stdout, proc.stderr):
                try:
                    if pipe and not pipe.closed:
                        pipe.close()
                except OSError:
                    pass
            self._abandoned.append(proc)
            log.warning(
                "collector dm: dmsetup pid %d did not exit after SIGKILL; abandoned", proc.pid
            )

    def _reap(self):
        self._abandoned = [p for p in self._abandoned if p.poll() is None]

    # -----------------------------------------------------------------------------------------

    def collect(self, scrape):
        dm = scrape.dm
        if not dm:
            return []
        devices = tuple(sorted(dm.items()))
        try:
            table_text = self.run(TABLE_ARGS, scrape.remaining())
            self._table = (devices, table_text)
        except DmsetupError as e:
            scrape.error(str(e), e.reason, subject="dmsetup table")
            if self._table is None or self._table[0] != devices:
                raise CollectorFailed() from None  # nothing to publish: the collector failed
            # The same dm devices (kernel names, dm names, uuids) as at the last table read: its
            # snapshot, origin and chunk facts stand (they change only when a device is made
            # anew), so a slow dmsetup on a loaded host does not make them blink out of the rules.
            table_text = self._table[1]
        status_text = (
            ""  # only snapshot, snapshot-merge and thin-pool targets have a status published
        )
        if (
            " snapshot" in table_text or " thin-pool" in table_text
        ):  # (a superset of the lines that do)
            try:
                status_text = self.run(STATUS_ARGS, scrape.remaining())
            except DmsetupError as e:
                scrape.error(
                    str(e), e.reason, subject="dmsetup status"
                )  # tables are still published
                status_text = None
        # parsed again only when something it depends on changed
        key = (table_text, status_text, devices, tuple(scrape.devices))
        families = self._reuse.families_for(
            scrape, key, lambda: self._families(scrape, dm, table_text, status_text)
        )
        read = self._part
        host = scrape.host
        host.targets, host.snapshots, host.pools = read.targets, read.snapshots, read.pools
        host.crypt_flags = read.crypt_flags  # for the findings: read here, never published
        return families

    def _families(self, scrape, dm, table_text, status_text):
        labels = ["device", "name"]
        m = {
            "target": GaugeMetricFamily(
                "blockstack_dm_target_info",
                "Each device-mapper target type in the device's table (value always 1).",
                labels=labels + ["target"],
            ),
            "snap": GaugeMetricFamily(
                "blockstack_dm_snapshot_info",
                "A snapshot or snapshot-merge target: origin and cow are the devices beneath it "
                "(origin is the -real device under LVM), persistent is the exception store type "
                "(P, PO or N), merge is true for snapshot-merge (value always 1).",
                labels=labels + ["origin", "cow", "persistent", "merge"],
            ),
            "used": GaugeMetricFamily(
                "blockstack_dm_snapshot_cow_used_bytes",
                "Bytes of the COW device in use, data and metadata together (sectors_allocated).",
                labels=labels,
            ),
            "size": GaugeMetricFamily(
                "blockstack_dm_snapshot_cow_size_bytes",
                "Size of the COW device in bytes.",
                labels=labels,
            ),
            "meta": GaugeMetricFamily(
                "blockstack_dm_snapshot_metadata_bytes",
                "Bytes of the COW device holding the exception store's header and metadata; a merge "
                "has finished when used equals metadata.",
                labels=labels,
            ),
            "chunk": GaugeMetricFamily(
                "blockstack_dm_snapshot_chunk_size_bytes",
                "Snapshot chunk size in bytes: the unit copied on first write, and the size of the "
                "requests the snapshot sends to the devices beneath it.",
                labels=labels,
            ),
            "state": GaugeMetricFamily(
                "blockstack_dm_snapshot_state",
                "Snapshot state, 1 for the current one: valid, invalid (dropped, e.g. COW full), "
                "overflow (COW full, store kept), merge_failed, merging (snapshot-merge running).",
                labels=labels + ["state"],
            ),
            "origin": GaugeMetricFamily(
                "blockstack_dm_snapshot_origin_info",
                "A snapshot-origin or snapshot-merge target and the device it maps (value always 1).",
                labels=labels + ["origin"],
            ),
            "pool_state": GaugeMetricFamily(
                "blockstack_dm_thin_pool_state",
                "Thin-pool state, 1 for the current one: rw, ro (read-only, e.g. metadata full), "
                "out_of_data_space, fail (the pool failed: I/O errors), error (the kernel could not "
                "read the pool's status).",
                labels=labels + ["state"],
            ),
            "data_used": GaugeMetricFamily(
                "blockstack_dm_thin_pool_data_used_bytes",
                "Thin-pool data space in use, in bytes.",
                labels=labels,
            ),
            "data_size": GaugeMetricFamily(
                "blockstack_dm_thin_pool_data_size_bytes",
                "Thin-pool data space, in bytes.",
                labels=labels,
            ),
            "meta_used": GaugeMetricFamily(
                "blockstack_dm_thin_pool_metadata_used_bytes",
                "Thin-pool metadata space in use, in bytes.",
                labels=labels,
            ),
            "meta_size": GaugeMetricFamily(
                "blockstack_dm_thin_pool_metadata_size_bytes",
                "Thin-pool metadata space, in bytes.",
                labels=labels,
            ),
        }
        self._part = DmRead()
        self._collect(scrape, dm, m, table_text, status_text)
        return [family for family in m.values() if family.samples]  # no HELP without a series

    def _collect(self, scrape, dm, m, table_text, status_text):
        tables = self._listing(scrape, "table", table_text)
        kernel_of = {name: kname for kname, (name, _) in dm.items()}

        status_of = None  # (name, start, length, target) -> status; None: status unavailable
        if status_text is not None:
            status_of = {}
            for t in self._listing(scrape, "status", status_text):
                status_of.setdefault((t.name, t.start, t.length, t.target), t.params)

        by_name = {}
        for t in tables:
            by_name.setdefault(t.name, []).append(t)
        for name in sorted(set(by_name) - set(kernel_of)):
            scrape.error(
                f"{name[:80]}: listed by dmsetup but not in sysfs (created during the scrape?)",
                "vanished",
            )
        for kname in sorted(dm):
            if dm[kname][0] not in by_name:
                scrape.error(
                    f"{kname} ({dm[kname][0][:80]}): in sysfs but not listed by dmsetup "
                    "(removed during the scrape?)",
                    "vanished",
                )

        for name, targets in sorted(by_name.items()):
            device = kernel_of.get(name)
            if device is None:
                continue
            seen_types, handled = set(), set()
            for t in targets:
                if t.target is None:
                    continue  # a device without a live table
                if t.target not in seen_types:
                    seen_types.add(t.target)
                    m["target"].add_metric([device, name, t.target], 1)
                    self._part.targets.setdefault(device, set()).add(t.target)
                if t.target == "crypt":
                    flags = self._part.crypt_flags.setdefault(device, set())
                    flags.update(crypt_flags(t.params))
                if t.target not in ("snapshot", "snapshot-merge", "snapshot-origin", "thin-pool"):
                    continue
                if t.target in handled:
                    scrape.error(
                        f"{device}: more than one {t.target} segment; only the first is published",
                        "series_limit",
                    )
                    continue
                handled.add(t.target)
                status = (
                    MISSING
                    if status_of is None
                    else status_of.get((t.name, t.start, t.length, t.target))
                )
                try:
                    if t.target in ("snapshot", "snapshot-merge"):
                        self._snapshot(scrape, device, name, t, status, m)
                    elif t.target == "snapshot-origin":
                        origin = self._device_name(scrape, parse_origin_table(t.params))
                        m["origin"].add_metric([device, name, origin], 1)
                    else:
                        self._thin_pool(scrape, device, name, t, status, m)
                except ParseError as e:
                    scrape.error(f"{device} ({name}): {e}")

    def _listing(self, scrape, what, text):
        targets, errors = parse_listing(text)
        if errors:  # one count per line, one log line for them all
            number, e = errors[0]
            scrape.error(
                f"dmsetup {what}: {len(errors)} unparseable lines, first: line {number}: {e}",
                subject=f"dmsetup {what} lines",
                count=len(errors),
            )
        return targets

    def _device_name(self, scrape, devno):
        kname = scrape.name_of_devno(devno)
        if kname is None:
            scrape.error(f"device {devno} is not in /sys/dev/block", "vanished")
            return devno
        return kname

    @staticmethod
    def _has_status(scrape, device, name, t, status):
        """Whether the target has a status line; a missing line is counted (MISSING: the status
        call failed, counted once already)."""
        if status is None:
            scrape.error(f"{device} ({name}): no {t.target} status line")
        return status is not None and status is not MISSING

    def _snapshot(self, scrape, device, name, t, status, m):
        table = parse_snapshot_table(t.params)
        merge = t.target == "snapshot-merge"
        origin = self._device_name(scrape, table["origin"])
        cow = self._device_name(scrape, table["cow"])
        lv = [device, name]
        m["snap"].add_metric(
            lv + [origin, cow, table["persistent"], "true" if merge else "false"], 1
        )
        m["chunk"].add_metric(lv, table["chunk_sectors"] * SECTOR)
        snap = self._part.snapshots[device] = {
            "name": name,
            "origin": origin,
            "cow": cow,
            "merge": merge,
            "chunk": table["chunk_sectors"] * SECTOR,
        }
        if merge:
            m["origin"].add_metric(lv + [origin], 1)
        if not self._has_status(scrape, device, name, t, status):
            return
        st = parse_snapshot_status(status)
        state = st["state"]
        if state == "valid" and merge:
            state = "merging"
        for s in SNAPSHOT_STATES:
            m["state"].add_metric(lv + [s], 1 if s == state else 0)
        if state in SNAPSHOT_STATES:
            snap["state"] = state
        if st["used_sectors"] is not None:
            m["used"].add_metric(lv, st["used_sectors"] * SECTOR)
            m["size"].add_metric(lv, st["total_sectors"] * SECTOR)
            snap.update(used=st["used_sectors"] * SECTOR, size=st["total_sectors"] * SECTOR)
        if st["metadata_sectors"] is not None:
            m["meta"].add_metric(lv, st["metadata_sectors"] * SECTOR)

    def _thin_pool(self, scrape, device, name, t, status, m):
        table = parse_thin_pool_table(t.params)
        if not self._has_status(scrape, device, name, t, status):
            return
        st = parse_thin_pool_status(status)
        lv = [device, name]
        pool = self._part.pools[device] = {"name": name}
        state = st["failed"].lower() if st["failed"] else st["mode"]
        if state is not None:  # None: an older kernel printed no mode word
            for s in THIN_POOL_STATES:
                m["pool_state"].add_metric(lv + [s], 1 if s == state else 0)
            if state in THIN_POOL_STATES:
                pool["state"] = state
        if st["failed"]:
            return
        block = table["data_block_sectors"] * SECTOR
        pool.update(
            data_used=st["used_data_blocks"] * block,
            data_size=st["total_data_blocks"] * block,
            meta_used=st["used_metadata_blocks"] * THIN_METADATA_BLOCK,
            meta_size=st["total_metadata_blocks"] * THIN_METADATA_BLOCK,
        )
        for key in ("data_used", "data_size", "meta_used", "meta_size"):
            m[key].add_metric(lv, pool[key])
