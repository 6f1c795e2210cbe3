"""device-mapper tables and status, read through device-mapper itself with `dmsetup`.

dmsetup.py runs it, dm_client.py asks the dm helper to (--collector.dm.helper), dm_parse.py
parses what it prints; this module publishes it.

Two commands, and only when sysfs shows dm devices:

    dmsetup table                 NAME: START LENGTH TARGET ARGS...   (one line per target)
    dmsetup status --noflush      NAME: START LENGTH TARGET STATUS...

The table only when it may have changed (KeptTable says how that is known); the status on every
scrape whose table has a snapshot, snapshot-merge or thin-pool target, and never otherwise. While
the kept table serves, the status is started at the scrape's start and read in the collector's
turn (DmCollector.begin), so that dmsetup runs while the collectors before it read sysfs.

When `dmsetup table` fails or runs out of time (a loaded host, a slow root filesystem) while
sysfs shows the same dm devices as at its last success, that table stands in, so that the
snapshot's facts do not blink out; the failure is still counted. `dmsetup status` (COW and pool
use) is never stood in for: a stale use would hide a snapshot filling.

Without a device argument dmsetup prefixes every line with the (mangled) device name. dmsetup
prints device numbers as MAJ:MIN (the kernel's format_dev_t); they are mapped to kernel names
through /sys/dev/block, dm names to dm-N through /sys/block/dm-N/dm/name.

Every target other than snapshot, snapshot-merge, snapshot-origin and thin-pool (linear, thin,
raid, crypt, ...) is published as blockstack_dm_target_info only; its arguments are never logged
or exported (a crypt table can carry a key).
"""

import os
from dataclasses import dataclass, field
from time import monotonic

from prometheus_client.core import GaugeMetricFamily

from ..fs import ParseError
from ..scrape import CollectorFailed, Reuse
from . import dm_parse
from .dm_client import HelperClient
from .dmsetup import STATUS_ARGS, TABLE_ARGS, Dmsetup, DmsetupError, Started

SECTOR = 512
THIN_METADATA_BLOCK = 4096  # drivers/md/dm-thin-metadata.h THIN_METADATA_BLOCK_SIZE
SNAPSHOT_STATES = ("valid", "invalid", "overflow", "merge_failed", "merging")
THIN_POOL_STATES = ("rw", "ro", "out_of_data_space", "fail", "error")
MISSING = object()  # the status call failed: already reported once
NOT_ASKED = object()  # no event token taken at the scrape's start (Early)
TABLE_MAX_AGE = 60.0  # seconds a kept table may serve at most (KeptTable)


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


@dataclass
class KeptTable:
    """The last `dmsetup table` read, kept while nothing says a table may have changed (a fork
    and exec of dmsetup on every scrape was most of a 100-device scrape).

    A live table changes only by device-mapper's ioctls, and every one that changes what
    `dmsetup table` prints moves the kernel's global event counter, which ControlEvents reads by
    poll(2) on /dev/mapper/control (through the dm helper, where the exporter may not open it):
    create, remove, rename, and the resume that swaps in a reloaded table, even one of the same
    size over the same devices (`cryptsetup refresh`), which nothing in sysfs shows. A load
    without a resume changes only the inactive table, which `dmsetup table` does not print. A
    deferred removal (done at the last close) moves no counter but takes the device out of
    sysfs: `devices`. TABLE_MAX_AGE bounds what a missed signal could cost; it is the staleness
    bound where the control node cannot be opened (no device-mapper, a test's tree)."""

    devices: tuple  # ((kernel name, (dm name, uuid)), ...) as sysfs showed them
    events: "str | None"  # the event token taken before the read (None: no control node)
    read_at: float  # monotonic() before the read
    text: str

    def serves(self, devices, events):
        return self.devices == devices and self.current(events)

    def current(self, events):
        """Serves as far as can be told without sysfs's devices (DmCollector.begin)."""
        return self.events == events and monotonic() - self.read_at < TABLE_MAX_AGE


def wants_status(table_text):
    """Whether a table has a target whose status is published: snapshot, snapshot-merge,
    thin-pool (a superset of the lines that do)."""
    return " snapshot" in table_text or " thin-pool" in table_text


@dataclass
class Early:
    """What DmCollector.begin did at the scrape's start, for collect() in its turn."""

    events: object = NOT_ASKED  # the event token, or the DmsetupError met asking for it
    status: "Started | None" = None  # `dmsetup status`, started, not read yet


class DmCollector:
    name = "dm"

    def __init__(self, dmsetup="dmsetup", timeout=5.0, helper=None, dev="/dev"):
        """helper: the Unix socket of dm_helper.py, asked instead of running dmsetup here; dev:
        --path.dev, whose mapper/control is watched for device-mapper's events (without helper)."""
        if helper:
            self._dmsetup = HelperClient(helper, timeout)
        else:
            control = os.path.join(dev, "mapper", "control")
            self._dmsetup = Dmsetup(dmsetup, timeout, control=control)
        # worth 25 % of a 1024-device scrape's CPU (make bench-exporter --without reuse-dm)
        self._reuse = Reuse()
        self._part = DmRead()  # the Host's part, of the families built last
        self._table = None  # KeptTable
        self._early = None  # Early, from this scrape's begin() to its end()

    def begin(self, scrape):
        """At the scrape's start, before the first collector's turn (scrape.py): when the kept
        table has a target whose status is published and still serves as far as can be told
        without sysfs (no device-mapper event since it was read, not too old), `dmsetup status`
        is started here and collect() reads it in its turn. Its fork, exec and ioctls (1.5-2 ms
        of a 100-device scrape's wall time, little of it this process's CPU) then overlap the
        queue and stack collectors' reading instead of following it.

        The event token is taken here, once a scrape (through the helper it is a round trip, and
        the helper answers one request at a time), and collect() uses it. A status begun but
        not read (the dm devices in sysfs changed, so the table is read again and the status
        after it, as without begin) is stopped by end()."""
        kept = self._table
        if kept is None or not wants_status(kept.text):
            return  # nothing to start: collect() does it all in its turn
        early = self._early = Early()
        try:
            early.events = self._dmsetup.events(scrape.remaining())
        except DmsetupError as e:
            early.events = e  # counted by collect(), which does not ask again (a mute helper)
            return
        if kept.current(early.events):
            try:
                early.status = self._dmsetup.start(STATUS_ARGS, scrape.remaining())
            except DmsetupError:
                pass  # collect() runs it in its turn, and counts what fails then

    def end(self):
        """A status begin() started and collect() did not read killed and reaped: called by
        collect() when it has what it needs, and by scrape.py at the scrape's end (also when
        the scrape raised before this collector's turn)."""
        early, self._early = self._early, None
        if early is not None and early.status is not None:
            self._dmsetup.stop(early.status)  # nothing if it was read

    def collect(self, scrape):
        early = self._early or Early()
        try:
            dm = scrape.dm
            if not dm:
                return []
            devices = tuple(sorted(dm.items()))
            table_text, kept = self._table_text(scrape, devices, early.events)
            status_text = ""  # only snapshot, snapshot-merge and thin-pool have a status published
            if wants_status(table_text):
                # the status begun before the table was known is read only if the kept table
                # served: one read again may name devices that status does not
                status_text = self._status_text(scrape, early.status if kept else None)
        finally:
            self.end()
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

    def _status_text(self, scrape, started):
        """`dmsetup status`'s output, of the one begin() started or else run now; None (the
        error counted) when it failed: the tables are still published."""
        try:
            if started is None:
                return self._dmsetup.run(STATUS_ARGS, scrape.remaining())
            return self._dmsetup.finish(started, scrape.remaining())
        except DmsetupError as e:
            scrape.error(str(e), e.reason, subject="dmsetup status")
            return None

    def _table_text(self, scrape, devices, events=NOT_ASKED):
        """`dmsetup table`'s output, and whether it is the kept one (KeptTable) rather than one
        read now. events: the token begin() took (or the DmsetupError it met), else taken here."""
        kept = self._table
        try:
            # taken before the read, so that a change during the read shows on the next scrape
            if events is NOT_ASKED:
                events = self._dmsetup.events(scrape.remaining())
            elif isinstance(events, DmsetupError):
                raise events
            if kept is not None and kept.serves(devices, events):
                return kept.text, True
            read_at = monotonic()
            text = self._dmsetup.run(TABLE_ARGS, scrape.remaining())
        except DmsetupError as e:
            scrape.error(str(e), e.reason, subject="dmsetup table")
            if kept is None or kept.devices != devices:
                raise CollectorFailed() from None  # nothing to publish: the collector failed
            # The same dm devices (kernel names, dm names, uuids) as at the last table read: its
            # snapshot, origin and chunk facts stand (they change only when a device is made
            # anew), so a slow dmsetup on a loaded host does not make them blink out of the rules.
            return kept.text, False
        self._table = KeptTable(devices, events, read_at, text)
        return text, False

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
                    flags.update(dm_parse.crypt_flags(t.params))
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
                        origin = self._device_name(scrape, dm_parse.parse_origin_table(t.params))
                        m["origin"].add_metric([device, name, origin], 1)
                    else:
                        self._thin_pool(scrape, device, name, t, status, m)
                except ParseError as e:
                    scrape.error(f"{device} ({name}): {e}")

    def _listing(self, scrape, what, text):
        targets, errors = dm_parse.parse_listing(text)
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
        table = dm_parse.parse_snapshot_table(t.params)
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
        st = dm_parse.parse_snapshot_status(status)
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
        table = dm_parse.parse_thin_pool_table(t.params)
        if not self._has_status(scrape, device, name, t, status):
            return
        st = dm_parse.parse_thin_pool_status(status)
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
