"""The devices a corpus case runs on beyond the lab's three (corpus.py's docstring names the
roles): `extend` adds single2 and the second stacked pair once, `Own` makes the devices a case
makes for itself (each removable during the case), `churn` removes one and makes it again with
I/O before and after, and `fio_args` points a workload at its role's device or filesystem."""

import contextlib
import fcntl
import os
import subprocess
import time

from blockstack_testsupport import procs

from . import loop
from .lab import CleanupStack

SINGLE2_SIZE = 1536 << 20
PDISK_SIZE = 768 << 20
# ioctls of /dev/loop-control (include/uapi/linux/loop.h)
LOOP_CTL_REMOVE = 0x4C81
# the order in which a group of `Case.own` (corpus.OWN) is made: a lower before its upper
MAKES = {"extra": ("extra",), "tpair": ("tlower", "tupper"), "parted": ("pdisk", "pupper")}
# the I/O on a device before and after `churn` takes it away: random 4 KiB direct reads, depth 4
CHURN_READS = ["--rw=randread", "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=4"]


def prepare(lab, case, es):
    """The devices of `case`: the lab extended, and the case's own devices made in `es` (they go
    when it closes). Returns the `Own` of the case."""
    extend(lab)
    own = es.enter_context(Own(lab))
    for group in case.own:
        for role in MAKES[group]:
            own.make(role)
    return own


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


def start_workloads(r, case, es):
    """One fio per workload of `case`, each stopped when `es` closes; returns {role: the stack of
    its fios}, so that a role's fios can be stopped before the role is removed."""
    fios = {}
    for i, (target, args) in enumerate(case.workloads):
        role = target.split(":", 1)[-1]
        fios.setdefault(role, es.enter_context(CleanupStack())).enter_context(
            r.fio(fio_args(r.lab, target, args, i), f"{case.name}-{i}")
        )
    return fios


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
        with r.fio(fio_args(lab, role, CHURN_READS, 0), f"{name}-{phase}"):
            r.watch(8, [role])
