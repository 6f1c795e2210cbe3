"""The detection corpora: healthy workloads that must never page, sick ones that must page once
each, written as data (`Case`) and run by one function on the lab's loop devices.

A page is a promise that something an operator can change is wrong: merging refused (nomerges),
requests split by a setting (max_sectors_kb) or by a layer. A workload's own shape never pages:
random I/O, small sequential direct I/O submitted one request at a time, a synchronous log
writer, readahead, streaming, idle and trickling devices, nomerges=1.

Devices (roles; `Lab` makes the first three, `extend` the others, all under the lab's directory):

    single, single2        loop devices alone (single2 is 1.5 GiB, sparse: room for readahead)
    upper -> lower         upper (direct-io, ext4 mounted) on a file on ext4 on lower
    upper2 -> lower2       a second, independent stacked pair

Devices a case makes for itself (`Case.own`, see `Own`), each one removable during the case:

    extra                  a loop device alone (removed for good with LOOP_CTL_REMOVE: gone from
                           sysfs and /proc/partitions, its number free for the next one)
    tupper -> tlower       a stacked pair like upper -> lower
    pupper -> pdisk1       an upper (buffered) on a file on ext4 on partition 1 of pdisk, a
                           partitioned loop device whose partition 2 (pdisk2) is left raw

`Case.churn` removes devices and makes them again (the same number when it is free) before the
onset, with I/O before and after; `Case.fix_remove` fixes a sick case by removing devices (the
upper device taken apart, or the collapsed device itself) instead of undoing the fault, and the
case then watches that nothing new pages.

A workload's target is a role (the raw device; reads are --readonly) or "fs:ROLE" (a file in the
ext4 mounted on ROLE: upper, upper2, lower, lower2). Sick cases run their workload healthy for
`warmup` seconds, then apply the fault (the onset) and wait for the pages; consecutive sick cases
use different devices so that one case's page, held by keep_firing_for after the fix, never
lands in the next. Resolve times are read from the receiver's file at the end of the run.
"""

import contextlib
import dataclasses
import fcntl
import os
import subprocess
import time

from blockstack_testsupport import procs

from . import loop, scenarios
from .lab import CleanupStack

SINGLE2_SIZE = 1536 << 20
STACK_ROLES = {"upper": "lower", "upper2": "lower2", "tupper": "tlower", "pupper": "pdisk1"}
PDISK_SIZE = 768 << 20
# ioctls of /dev/loop-control (include/uapi/linux/loop.h)
LOOP_CTL_REMOVE = 0x4C81


# -- fio workloads ------------------------------------------------------------------------------


def seq(rw, bs="4k", depth=16, batch=False, direct=True, engine="libaio", extra=()):
    """Sequential I/O. batch=False: one request per io_submit (what an application submitting
    as it goes does); batch=True: `depth` requests per io_submit, in one plug (readahead, a
    dm layer splitting a large bio, an application batching)."""
    args = [f"--rw={rw}", f"--bs={bs}", f"--direct={int(direct)}", f"--ioengine={engine}"]
    if engine == "libaio":
        args.append(f"--iodepth={depth}")
        if batch:
            args += [
                f"--iodepth_batch_submit={depth}",
                f"--iodepth_batch_complete_min={max(1, depth // 2)}",
            ]
    return [*args, *extra]


def rand(rw, bs="4k", depth=16):
    return [f"--rw={rw}", f"--bs={bs}", "--direct=1", "--ioengine=libaio", f"--iodepth={depth}"]


BATCHED_READ = seq("read", depth=64, batch=True)
BATCHED_WRITE = seq("write", depth=64, batch=True)
LOG_WRITER_DSYNC = ["--rw=write", "--bs=4k", "--ioengine=psync", "--direct=1", "--sync=dsync"]
LOG_WRITER_FDATASYNC = ["--rw=write", "--bs=4k", "--ioengine=psync", "--fdatasync=1"]
TRICKLE = ["--rw=randrw", "--bs=4k", "--direct=1", "--ioengine=psync", "--rate_iops=5,5"]


@dataclasses.dataclass
class Case:
    name: str
    doc: str
    workloads: list  # [(target, fio args)]
    settings: dict = dataclasses.field(
        default_factory=dict
    )  # {(role, attr): value}, part of the workload
    fault: dict = dataclasses.field(default_factory=dict)  # {(role, attr): value} at onset (sick)
    pages: tuple = ()  # roles that must page, one page each; () = healthy
    intermittent: tuple = ()  # (collapsed s, healthy s, cycles): the fault comes and goes
    own: tuple = ()  # devices the case makes for itself (`Own`): extra, tpair, parted
    churn: tuple = ()  # roles removed and made again, with I/O on them, before the onset
    fix_remove: tuple = ()  # sick: the fix is removing these roles (the fault stays)

    @property
    def sick(self):
        return bool(self.pages)

    def roles(self):
        roles = (
            {t.split(":", 1)[-1] for t, _ in self.workloads}
            | {r for r, _ in self.settings}
            | {r for r, _ in self.fault}
            | set(self.pages)
        )
        for group in self.own:
            roles |= set(OWN[group])
        for upper, lower in STACK_ROLES.items():  # a stack's devices go together
            if upper in roles or lower in roles:
                roles |= {upper, lower}
        return sorted(roles)


NOMERGES2 = "queue/nomerges", "2"
SPLIT4K = "queue/max_sectors_kb", "4"
DEADLINE = "queue/scheduler", "mq-deadline"


def _on(roles, setting):
    return {(r, setting[0]): setting[1] for r in roles}


HEALTHY = [
    Case(
        "healthy-random",
        "random 4 KiB and 8 KiB direct I/O at queue depth 8-16: raw devices and files "
        "in the stacked ext4s",
        [
            ("single", rand("randrw", "4k", 16)),
            ("single2", rand("randrw", "8k", 16)),
            ("fs:upper", rand("randread", "4k", 16)),
            ("fs:upper2", rand("randwrite", "8k", 8)),
        ],
    ),
    Case(
        "healthy-seq-unbatched-read",
        "small sequential direct reads submitted one request at a time "
        "(the issue's false page) at queue depths 4, 32, 16 and 8",
        [
            ("single", seq("read", depth=4)),
            ("single2", seq("read", depth=32)),
            ("upper", seq("read", depth=16)),
            ("fs:upper2", seq("read", depth=8)),
        ],
    ),
    Case(
        "healthy-seq-unbatched-write",
        "small sequential direct writes submitted one request at a time "
        "at queue depths 8, 32, 16 and 4",
        [
            ("single", seq("write", depth=8)),
            ("single2", seq("write", depth=32)),
            ("fs:upper", seq("write", depth=16)),
            ("fs:upper2", seq("write", depth=4)),
        ],
    ),
    Case(
        "healthy-log-writer",
        "synchronous log writers: 4 KiB O_DSYNC direct appends and 4 KiB buffered "
        "appends with fdatasync, depth 1, in the stacked ext4s; depth-1 sequential direct I/O on raw devices",
        [
            ("fs:upper", LOG_WRITER_DSYNC),
            ("fs:upper2", LOG_WRITER_FDATASYNC),
            ("single", seq("write", engine="psync")),
            ("single2", seq("read", engine="psync")),
        ],
    ),
    Case(
        "healthy-streaming",
        "large sequential streaming: 1 MiB direct reads and writes at depth 4",
        [
            ("single", seq("read", "1m", 4)),
            ("single2", seq("write", "1m", 4)),
            ("upper", seq("read", "1m", 4)),
            ("fs:upper2", seq("write", "1m", 4)),
        ],
    ),
    Case(
        "healthy-readahead",
        "buffered 4 KiB sequential reads through readahead (rate-limited so that "
        "they keep reaching the device)",
        [
            ("single2", seq("read", direct=False, engine="psync", extra=["--rate=20m"])),
            ("lower2", seq("read", direct=False, engine="psync", extra=["--rate=6m"])),
        ],
    ),
    Case(
        "healthy-mixed",
        "four concurrent jobs on one device: batched sequential reads, random 4 KiB "
        "reads and writes, 1 MiB writes, unbatched sequential 4 KiB writes",
        [
            ("single", [*BATCHED_READ, "--offset=0", "--size=64m"]),
            ("single", [*rand("randrw", "4k", 8), "--offset=64m", "--size=64m"]),
            ("single", [*seq("write", "1m", 2), "--offset=128m", "--size=64m"]),
            ("single", [*seq("write", depth=16), "--offset=192m", "--size=64m"]),
        ],
    ),
    Case(
        "healthy-idle-trickle",
        "5 + 5 random 4 KiB IOPS on a raw device and in an ext4; the other devices idle",
        [("single", TRICKLE), ("fs:upper", TRICKLE)],
    ),
    Case(
        "healthy-batched",
        "batched sequential 4 KiB reads and writes with merging on: merged into large requests",
        [("single", BATCHED_READ), ("single2", BATCHED_WRITE), ("upper", BATCHED_READ)],
    ),
    Case(
        "healthy-nomerges-1",
        "nomerges=1 (one-hit merges only) under batched sequential reads and "
        "writes, alone and beneath a stack",
        [("single", BATCHED_READ), ("single2", BATCHED_WRITE), ("upper", BATCHED_READ)],
        settings=_on(("single", "single2", "lower"), ("queue/nomerges", "1")),
    ),
    Case(
        "healthy-mq-deadline",
        "scheduler mq-deadline, small sequential direct I/O submitted one at a "
        "time, depth 32 and 16",
        [("single2", seq("read", depth=32)), ("fs:upper", seq("write", depth=16))],
        settings=_on(("single2", "upper", "lower"), DEADLINE),
    ),
]

SICK = [
    Case(
        "sick-nomerges2-read",
        "nomerges 0 -> 2 under batched sequential 4 KiB direct reads on a device alone",
        [("single", BATCHED_READ)],
        fault=_on(("single",), NOMERGES2),
        pages=("single",),
    ),
    Case(
        "sick-split-read",
        "stacked split: the lower's max_sectors_kb 1280 -> 4 under batched sequential "
        "reads on the upper",
        [("upper", BATCHED_READ)],
        fault=_on(("lower",), SPLIT4K),
        pages=("lower",),
    ),
    Case(
        "sick-nomerges2-write",
        "nomerges 0 -> 2 under batched sequential 4 KiB direct writes on a device alone",
        [("single2", BATCHED_WRITE)],
        fault=_on(("single2",), NOMERGES2),
        pages=("single2",),
    ),
    Case(
        "sick-split-write",
        "stacked split: the lower's max_sectors_kb 1280 -> 4 under batched sequential "
        "writes to a file in the upper's ext4",
        [("fs:upper2", BATCHED_WRITE)],
        fault=_on(("lower2",), SPLIT4K),
        pages=("lower2",),
    ),
    Case(
        "sick-nomerges2-read-deadline",
        "nomerges 0 -> 2 under batched sequential reads, scheduler mq-deadline",
        [("single", BATCHED_READ)],
        settings=_on(("single",), DEADLINE),
        fault=_on(("single",), NOMERGES2),
        pages=("single",),
    ),
    Case(
        "sick-nomerges2-read-beneath",
        "nomerges 0 -> 2 on a device beneath a stack, under batched "
        "sequential reads of a file in its ext4",
        [("fs:lower", BATCHED_READ)],
        fault=_on(("lower",), NOMERGES2),
        pages=("lower",),
    ),
    Case(
        "sick-nomerges2-write-beneath",
        "nomerges 0 -> 2 on a device beneath a stack, under batched "
        "sequential writes to a file in its ext4",
        [("fs:lower2", BATCHED_WRITE)],
        fault=_on(("lower2",), NOMERGES2),
        pages=("lower2",),
    ),
    Case(
        "sick-split-read-deadline",
        "stacked split (lower max_sectors_kb=4) under batched reads, "
        "scheduler mq-deadline on both layers",
        [("upper", BATCHED_READ)],
        settings=_on(("upper", "lower"), DEADLINE),
        fault=_on(("lower",), SPLIT4K),
        pages=("lower",),
    ),
    Case(
        "sick-split-write-deadline",
        "stacked split (lower max_sectors_kb=4) under batched writes to a "
        "file in the upper's ext4, scheduler mq-deadline on both layers",
        [("fs:upper2", BATCHED_WRITE)],
        settings=_on(("upper2", "lower2"), DEADLINE),
        fault=_on(("lower2",), SPLIT4K),
        pages=("lower2",),
    ),
    Case(
        "sick-intermittent",
        "nomerges flips 2 / 0 every 20 s for 160 s under batched sequential reads: "
        "one page, not one per flip",
        [("single2", BATCHED_READ)],
        fault=_on(("single2",), NOMERGES2),
        pages=("single2",),
        intermittent=(20, 20, 4),
    ),
    Case(
        "sick-two-stacks",
        "two independent stacks split at once (both lowers' max_sectors_kb=4) under "
        "batched reads: two pages, one per stack",
        [("upper", BATCHED_READ), ("upper2", BATCHED_READ)],
        fault=_on(("lower", "lower2"), SPLIT4K),
        pages=("lower", "lower2"),
    ),
]

# Shared devices, devices that come and go, topology changes during a page. A page rests on the
# device's own requests (refused merges, split pieces): small requests of another user of the
# device beneath a stack never page, and a device's name, identity and page survive it going and
# coming back or the stack above it changing.
HEALTHY += [
    Case(
        "healthy-shared-disk",
        "a stack above streams 1 MiB direct reads while another application on the "
        "device beneath reads 4 KiB one request at a time (a file beside the stack's backing file, and the raw "
        "device): the small requests are not the stack's",
        [
            ("upper2", seq("read", "1m", 4)),
            ("fs:lower2", seq("read", depth=16)),
            ("lower2", [*seq("read", depth=8), "--offset=256m"]),
        ],
    ),
    Case(
        "healthy-shared-partition",
        "a buffered loop device on a file on partition 1 of a disk streams 1 MiB "
        "direct reads (mostly from the page cache) while partition 2 serves 4 KiB direct reads one request at a "
        "time and 4 KiB random reads: the averages line up as a collapse of the disk (the issue's false page)",
        [
            ("pupper", seq("read", "1m", 4)),
            ("pdisk2", seq("read", depth=16)),
            ("pdisk2", [*rand("randread", "4k", 8), "--offset=128m"]),
        ],
        own=("parted",),
    ),
    Case(
        "healthy-device-churn",
        "a device attached, used, removed and attached again (its number reused) "
        "during the run, then batched sequential reads on it with merging on, random I/O beside it",
        [("extra", BATCHED_READ), ("single", rand("randrw", "4k", 8))],
        own=("extra",),
        churn=("extra",),
    ),
]

SICK += [
    Case(
        "sick-nomerges2-reattached",
        "a device attached after the stack started, used, removed and attached "
        "again with the same number; then nomerges 0 -> 2 under batched sequential reads on it",
        [("extra", BATCHED_READ)],
        fault=_on(("extra",), NOMERGES2),
        pages=("extra",),
        own=("extra",),
        churn=("extra",),
    ),
    Case(
        "sick-split-upper-removed",
        "stacked split (the lower's max_sectors_kb=4) under batched reads on the "
        "upper; the fix is taking the stack apart (the upper removed, the lower keeps max_sectors_kb=4): one "
        "page, resolved, no new one",
        [("tupper", BATCHED_READ)],
        fault=_on(("tlower",), SPLIT4K),
        pages=("tlower",),
        own=("tpair",),
        fix_remove=("tupper",),
    ),
    Case(
        "sick-collapse-device-removed",
        "nomerges 0 -> 2 under batched sequential reads on a device, then the "
        "device is removed while collapsed: one page, resolved",
        [("extra", BATCHED_READ)],
        fault=_on(("extra",), NOMERGES2),
        pages=("extra",),
        own=("extra",),
        fix_remove=("extra",),
    ),
]

CASES = {c.name: c for c in HEALTHY + SICK}
GROUPS = {"healthy": [c.name for c in HEALTHY], "sick": [c.name for c in SICK]}


def expand(names):
    """Scenario names with `healthy`, `sick` and `corpus` expanded to the cases they stand for."""
    out = []
    for name in names:
        if name == "corpus":
            out += GROUPS["healthy"] + GROUPS["sick"]
        else:
            out += GROUPS.get(name, [name])
    return out


def known():
    return [*scenarios.SCENARIOS, *CASES, *GROUPS, "corpus"]


def describe(name):
    if name in CASES:
        c = CASES[name]
        expect = ("must page on " + ", ".join(c.pages)) if c.sick else "must not page"
        return f"{c.doc}. {expect[0].upper()}{expect[1:]}."
    if name in GROUPS or name == "corpus":
        return f"the cases {', '.join(expand([name]))}"
    return scenarios.describe(name)


# -- the extra devices ------------------------------------------------------------------------


def extend(lab):
    """Add single2 and the second stacked pair (upper2 -> lower2) to the lab, once; they go when
    the lab closes."""
    if "single2" in lab.devices:
        return
    lab.devices["single2"] = lab.enter(loop.attached(SINGLE2_SIZE, directory=lab.dir))
    lab.baseline("single2")
    lab.enter(lab.pair("upper2", "lower2"))
    lab.say(
        f"lab: {lab.name('single2')} alone; {lab.name('upper2')} (direct-io, ext4) on a file on ext4 on "
        f"{lab.name('lower2')}"
    )


# -- devices a case makes for itself ------------------------------------------------------------

OWN = {
    "extra": ("extra",),
    "tpair": ("tupper", "tlower"),
    "parted": ("pupper", "pdisk", "pdisk1", "pdisk2"),
}
MAKES = {"extra": ("extra",), "tpair": ("tlower", "tupper"), "parted": ("pdisk", "pupper")}


class Own:
    """The devices one case makes (`Case.own`), each role in a stack of its own so that the case
    can remove it (`remove`) and make it again (`make`); everything left goes on exit."""

    def __init__(self, lab):
        self.lab, self.stacks = lab, {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for role in reversed(list(self.stacks)):
            self.remove(role)

    def make(self, role):
        with CleanupStack() as es:
            self._make(role, es)
            self.stacks[role] = es.pop_all()

    def _make(self, role, es):
        lab = self.lab
        if role == "extra":
            lab.devices[role] = es.enter_context(removable(SINGLE2_SIZE // 4, lab.dir))
        elif role == "tlower":
            lab.devices[role] = es.enter_context(loop.attached(512 << 20, directory=lab.dir))
            lab.mounts[role] = es.enter_context(
                loop.ext4(lab.devices[role], loop.NO_DISCARD, directory=lab.dir)
            )
            loop.fill(os.path.join(lab.mounts[role], "upper.img"), 192 << 20)
        elif role == "pdisk":
            disk = es.enter_context(partitioned(PDISK_SIZE, lab.dir))
            lab.devices.update(pdisk=disk, pdisk1=disk + "p1", pdisk2=disk + "p2")
            lab.mounts["pdisk1"] = es.enter_context(
                loop.ext4(disk + "p1", loop.NO_DISCARD, directory=lab.dir)
            )
            loop.fill(os.path.join(lab.mounts["pdisk1"], "upper.img"), 192 << 20)
        else:  # an upper on the file its lower holds; pupper buffered (losetup's default): its
            # reads come from the page cache once the file is cached, as the loop on vda did
            lower = {"tupper": "tlower", "pupper": "pdisk1"}[role]
            lab.devices[role] = es.enter_context(
                loop.attached(
                    path=os.path.join(lab.mounts[lower], "upper.img"), direct_io=role == "tupper"
                )
            )
        lab._save()
        if role != "pdisk":
            es.enter_context(lab._baseline_cm(role))
        lab.say(f"made {role}: {lab.name(role)}")

    def remove(self, role):
        lab = self.lab
        name = lab.name(role)
        self.stacks.pop(role).close()
        for r in ("pdisk", "pdisk1", "pdisk2") if role == "pdisk" else (role,):
            lab.devices.pop(r, None)
            lab.mounts.pop(r, None)
        lab._save()
        lab.say(f"removed {role}: {name}")


@contextlib.contextmanager
def removable(size, directory):
    """A loop device over a sparse file; on exit detached and removed for good (LOOP_CTL_REMOVE),
    as a device-mapper device or a hot-unplugged disk goes: out of sysfs and /proc/partitions."""
    with loop.attached(size, directory=directory) as dev:
        yield dev
    number = int(loop.name(dev)[len("loop") :])
    fd = os.open("/dev/loop-control", os.O_RDWR)
    try:
        for _ in range(20):  # the detach completes asynchronously while the device is still open
            try:
                fcntl.ioctl(fd, LOOP_CTL_REMOVE, number)
                return
            except OSError:
                time.sleep(0.1)
    finally:
        os.close(fd)


@contextlib.contextmanager
def partitioned(size, directory):
    """A loop device with two partitions (p1 256 MiB, p2 the rest); yields '/dev/loopN'."""
    with loop.backing_file(size, directory) as path:
        dev = loop._run(["losetup", "--find", "--show", "--partscan", path])
        try:
            subprocess.run(
                ["sfdisk", "--quiet", dev],
                input="label: dos\n,256M\n,\n",
                text=True,
                check=True,
                capture_output=True,
                timeout=60,
            )
            # sfdisk's re-read of the table does not always add the partitions of a loop device
            # reused from an earlier owner; partx adds what is missing (and fails on what is there)
            subprocess.run(["partx", "--add", dev], capture_output=True, timeout=60)
            procs.wait_until(
                f"{dev}'s partitions",
                lambda: os.path.exists(dev + "p2") and os.path.exists(dev + "p1"),
                30,
                interval=0.2,
            )
            yield dev
        finally:
            loop.detach(dev)


def fio_args(lab, target, args, index):
    if target.startswith("fs:"):
        mnt = lab.mounts[target[3:]]
        return [*args, f"--directory={mnt}", f"--filename=corpus-{index}.dat", "--size=32m"]
    dev = lab.devices[target]
    ro = ["--readonly"] if any(a in ("--rw=read", "--rw=randread") for a in args) else []
    return [*args, f"--filename={dev}", *ro]


# -- running a case ---------------------------------------------------------------------------


def run_case(r, case):
    """Run one case on runner r; returns its Check (resolve time filled in later by `resolves`)."""
    lab = r.lab
    extend(lab)
    with CleanupStack() as es:
        own = es.enter_context(Own(lab))
        for group in case.own:
            for role in MAKES[group]:
                own.make(role)
        devices = {lab.name(role) for role in case.roles()}
        settle(r, devices)
        for role in case.churn:
            churn(r, own, role, case.name)
            devices.add(lab.name(role))
        for (role, attr), value in case.settings.items():
            es.enter_context(lab.setting(role, attr, value))
        fios = {}  # role -> its fio, stopped before the role is removed
        for i, (target, args) in enumerate(case.workloads):
            role = target.split(":", 1)[-1]
            fios.setdefault(role, es.enter_context(CleanupStack())).enter_context(
                r.fio(fio_args(lab, target, args, i), f"{case.name}-{i}")
            )
        roles = case.roles()
        if not case.sick:
            onset = time.time()
            r.say(f"{case.name}: {case.doc}; watching {r.t.corpus_quiet:.0f} s")
            return judge(
                r, case, onset, devices, watch=lambda: r.watch(r.t.corpus_quiet, roles, onset)
            )
        r.say(f"{case.name}: healthy for {r.t.corpus_warmup:.0f} s first")
        r.watch(r.t.corpus_warmup, roles)
        onset = time.time()
        if case.intermittent:
            on, off, cycles = case.intermittent

            fixed = []

            def watch():
                for c in range(cycles):
                    with fault(lab, case):
                        r.watch(on, roles, onset)
                    fixed.append(time.time())
                    r.say(
                        f"+{time.time() - onset:.0f}s healthy again for {off} s (cycle {c + 1} of {cycles})"
                    )
                    r.watch(off, roles, onset)

            check = judge(r, case, onset, devices, watch)
            check.fixed_at = fixed[-1]  # the last flip back
        elif case.fix_remove:
            with CleanupStack() as faults:
                for (
                    role,
                    attr,
                ), value in case.fault.items():  # a removed device takes its setting along
                    stack = own.stacks[role] if role in case.fix_remove else faults
                    stack.enter_context(lab.setting(role, attr, value))
                check = judge(r, case, onset, devices, lambda: wait_pages(r, case, onset))
                check.fixed_at = time.time()
                for role in case.fix_remove:
                    if role in fios:
                        fios.pop(role).close()
                    own.remove(role)
                after_fix(r, case, check, devices)
        else:
            with fault(lab, case):
                check = judge(r, case, onset, devices, lambda: wait_pages(r, case, onset))
                check.fixed_at = time.time()
        return check


def churn(r, own, role, name):
    """I/O on a device, the device removed for longer than a scrape, made again (the lowest free
    number: the same one when no one took it), I/O again: what a snapshot made and dropped for a
    backup, or a reset NVMe, does to the numbers ebpf_exporter sees."""
    lab = r.lab
    for phase in ("before", "after"):
        if phase == "after":
            own.remove(role)
            time.sleep(12)
            own.make(role)
        with r.fio(fio_args(lab, role, rand("randread", "4k", 4), 0), f"{name}-{phase}"):
            r.watch(8, [role])


def after_fix(r, case, check, devices):
    """After a fix by removal: watch as long as a healthy case, then count a page that started
    after the fix (one from the window before it, or under a new identity) as a false page."""
    r.say(
        f"{case.name}: fixed by removing {', '.join(case.fix_remove)}; watching {r.t.corpus_quiet:.0f} s"
    )
    r.watch(r.t.corpus_quiet, [x for x in case.roles() if x in r.lab.devices])
    if r.view is None:
        return
    late = pages_since(r, check.fixed_at + 1, devices)
    starts = {
        (n.alertname, n.device, n.labels.get("operation", ""), round(n.starts_at)) for n in late
    }
    if starts:
        check.false_pages += len(starts)
        check.correct = False
        check.observed += "; after the fix " + ", ".join(
            f"page {a} on {d} ({op})" for a, d, op, _ in sorted(starts)
        )
        r.say(f"{case.name}: new pages after the fix - WRONG: {sorted(starts)}")


@contextlib.contextmanager
def fault(lab, case):
    with CleanupStack() as es:
        for (role, attr), value in case.fault.items():
            es.enter_context(lab.setting(role, attr, value))
        yield


def settle(r, devices):
    """Wait (bounded) until no page is pending or firing on these devices: a previous case's page
    held by keep_firing_for must not count in this one."""
    if r.view is None:
        return

    def quiet():
        return not [
            a for a in r.view.alerts(sorted(devices), with_severity=True) if a[3] == "critical"
        ]

    try:
        procs.wait_until(
            "pages on the case's devices to clear", quiet, r.t.settle_timeout, interval=2
        )
    except TimeoutError:
        r.say(f"still paging after {r.t.settle_timeout:.0f} s on {sorted(devices)}")


def wait_pages(r, case, onset):
    """Until every expected page has arrived at the receiver (or page_timeout); then linger."""
    if r.view is None:
        r.watch(r.t.page_timeout, case.roles(), onset)
        return
    want = {r.lab.name(role) for role in case.pages}

    def arrived():
        got = {n.device for n in pages_since(r, onset, want)}
        return got >= want

    if r.watch(r.t.page_timeout, case.roles(), onset, until=arrived):
        time.sleep(r.t.linger)


def pages_since(r, onset, devices):
    return [n for n in r.new_firing(onset, devices) if n.path == "/page"]


def judge(r, case, onset, devices, watch):
    lab = r.lab
    expected = ("page on " + ", ".join(lab.name(p) for p in case.pages)) if case.sick else "no page"
    phase = "sick" if case.sick else "healthy"
    if r.view is None:
        watch()
        return scenarios.Check(case.name, phase, expected, "not observed (no stack)", True)
    watch()
    got = pages_since(r, onset, devices)
    # one page = one alert (alertname, device, operation) with one startsAt: an alert that
    # resolves and fires again counts twice; the same alert repeated in a later notification of
    # its group (another alert joined) counts once
    starts = {}
    for n in got:
        key = (n.alertname, n.device, n.labels.get("operation", ""))
        starts.setdefault(key, set()).add(round(n.starts_at))
    first = {}
    for n in got:
        first.setdefault(n.device, n)
    suppressed = r.view.suppressed()
    late = sorted(
        {
            (a, d, s)
            for a, d, s, sev in r.view.alerts(sorted(devices), with_severity=True)
            if sev == "critical"
            and (a, d) not in suppressed
            and not any(k[0] == a and k[1] == d for k in starts)
        }
    )
    parts = [
        f"page {a} on {d} ({op})" + (f" x{len(s)}" if len(s) > 1 else "")
        for (a, d, op), s in sorted(starts.items())
    ]
    parts += [f"{s} page {a} on {d} in Prometheus" for a, d, s in late]
    observed = ", ".join(parts) or "no page"
    want = {lab.name(p) for p in case.pages}
    paged = {d for (_, d, _) in starts} | {d for _, d, _ in late}
    once = all(len(s) == 1 for s in starts.values())
    correct = paged == want and once
    seconds = None
    if case.sick and want <= set(first):
        seconds = max(first[d].received_at for d in want) - onset
        for d in sorted(want):
            n = first[d]
            r.say(
                f"+{n.received_at - onset:.0f}s PAGE {n.alertname} on {d}: {n.annotations.get('summary', '')}"
            )
            for key in ("description", "doctor"):
                if n.annotations.get(key):
                    r.say(f"    {key}: {' '.join(n.annotations[key].split())}")
    r.say(
        f"{case.name}: expected {expected}; observed {observed}"
        + (f" after {seconds:.0f} s" if seconds is not None else "")
        + (" - OK" if correct else " - WRONG")
    )
    check = scenarios.Check(case.name, phase, expected, observed, correct, seconds)
    check.onset = onset
    check.expected_pages = len(want)
    check.true_pages = len(want & paged)
    check.false_pages = len(paged - want) + sum(len(s) - 1 for s in starts.values())
    check.page_seconds = {d: first[d].received_at - onset for d in want if d in first}
    return check


def resolves(r, checks, timeout=200):
    """Fill in each sick check's seconds from the fix to the resolve at the receiver, waiting
    (bounded) for the last ones."""
    if r.view is None:
        return
    pending = [c for c in checks if getattr(c, "fixed_at", None) and c.seconds is not None]

    def fill():
        for c in pending:
            if c.resolved_seconds is not None:
                continue
            devices = set(c.page_seconds)
            done = {}  # the first resolve of each device after the fix (later cases page it again)
            for n in r.view.notifications(c.fixed_at):
                if n.status == "resolved" and n.device in devices:
                    done.setdefault(n.device, n.received_at)
            if set(done) >= devices:
                c.resolved_seconds = max(done.values()) - c.fixed_at
        return all(c.resolved_seconds is not None for c in pending)

    try:
        procs.wait_until("the last resolves", fill, timeout, interval=5)
    except TimeoutError:
        r.say(f"some resolves did not arrive within {timeout} s")


def run(runner, names):
    """Run scenarios and corpus cases in order on one lab; returns every Check."""
    checks = []
    for name in expand(names):
        runner.say(f"== {name}: {describe(name)}")
        if name in CASES:
            checks.append(run_case(runner, CASES[name]))
        else:
            runner.settle()
            checks += scenarios.SCENARIOS[name](runner)
    resolves(runner, checks)
    return checks


def summary(checks):
    """Precision and recall of the pages over the corpus cases (page level: a sick case expects one
    page per device it names; a page anywhere in a healthy case, on a device a sick case does not
    name, or a second page of the same alert is a false page), and the onset-to-page seconds."""
    cases = [c for c in checks if c.scenario in CASES and hasattr(c, "expected_pages")]
    tp = sum(c.true_pages for c in cases)
    fp = sum(c.false_pages for c in cases)
    expected = sum(c.expected_pages for c in cases)
    return {
        "cases": len(cases),
        "healthy": sum(1 for c in cases if not CASES[c.scenario].sick),
        "sick": sum(1 for c in cases if CASES[c.scenario].sick),
        "expected_pages": expected,
        "true_pages": tp,
        "false_pages": fp,
        "missed_pages": expected - tp,
        "precision": tp / (tp + fp) if tp + fp else float("nan"),
        "recall": tp / expected if expected else float("nan"),
        "page_seconds": sorted(s for c in cases for s in getattr(c, "page_seconds", {}).values()),
    }


def format_summary(s):
    secs = ", ".join(f"{x:.0f}" for x in s["page_seconds"]) or "-"
    return (
        f"corpus: {s['healthy']} healthy and {s['sick']} sick cases; {s['true_pages']} of {s['expected_pages']} "
        f"expected pages, {s['false_pages']} false; precision {s['precision']:.2f}, recall {s['recall']:.2f}; "
        f"onset to page (s): {secs}"
    )
