"""The detection corpora: healthy workloads that must never page, sick ones that must page once
each, written as data (`Case`) and run on the lab's loop devices by pipeline.py.

A page is a promise that something an operator can change is wrong: merging refused (nomerges),
requests split by a setting (max_sectors_kb) or by a layer. A workload's own shape never pages:
random I/O, small sequential direct I/O submitted one request at a time, a synchronous log
writer, readahead, streaming, idle and trickling devices, nomerges=1.

Devices (roles; `Lab` makes the first three, `case_devices.extend` the others, all under the lab's directory):

    single, single2        loop devices alone (single2 is 1.5 GiB, sparse: room for readahead)
    upper -> lower         upper (direct-io, ext4 mounted) on a file on ext4 on lower
    upper2 -> lower2       a second, independent stacked pair

Devices a case makes for itself (`Case.own`, see `case_devices.Own`), each one removable during the case:

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

import dataclasses

from . import pipeline, scenarios

STACK_ROLES = {"upper": "lower", "upper2": "lower2", "tupper": "tlower", "pupper": "pdisk1"}
# the roles of each group of devices a case makes for itself (`Case.own`; case_devices.Own)
OWN = {
    "extra": ("extra",),
    "tpair": ("tupper", "tlower"),
    "parted": ("pupper", "pdisk", "pdisk1", "pdisk2"),
}


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


def plan(names):
    """[(name, description, Case or None)] of the names, groups expanded: what pipeline.run runs."""
    return [(name, describe(name), CASES.get(name)) for name in expand(names)]


def run(runner, names):
    """Run scenarios and corpus cases in order on one lab; returns every Check."""
    return pipeline.run(runner, plan(names))


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
