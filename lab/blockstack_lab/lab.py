"""The lab: loop devices, filesystems and sysfs settings for the scenarios, in one private
directory on /dev/shm, all undone on exit; and the signal handling and stale-lab sweep that make
"all" hold after Ctrl-C, SIGTERM and SIGKILL.

    single  loopS  a loop device over a sparse file (single-device scenarios)
    upper   loopU  (direct-io, ext4 mounted) over a file on ext4 on
    lower   loopL  a loop device over a file: the stacked pair of the NVMe incident

The journal scenario adds its own devices. Everything the lab creates lives under its directory
(backing files and mountpoints), and it keeps a journal there, lab.json: its pid, its devices and
mounts by role, every sysfs setting changed now (device, attribute, value before, value set).
On exit (success, failure, Ctrl-C, SIGTERM) it restores the settings, unmounts, detaches and
removes the directory; a final sweep catches anything an interrupt left half-made. Signals are
deferred while it cleans up. `sweep_stale` undoes a lab whose process was killed, from its journal.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from blockstack_exporter.devices import parse_mountinfo
from blockstack_testsupport import procs

from . import loop

LAB_ROOT = "/dev/shm"  # backing files in memory: fast, and nothing beneath the lower device
DISK_ROOT = "/var/tmp"  # the journal scenario's lower devices: on the root disk, where fsync costs
SINGLE_SIZE = 256 << 20
LOWER_SIZE = 512 << 20
UPPER_SIZE = 192 << 20
JOURNAL_LOWER_SIZE = 4 << 30  # sparse files: room for a 1 GiB journal and the writers' files
JOURNAL_UPPER_SIZE = 3 << 30
SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The queue settings every scenario starts from (a fresh loop device's defaults).
BASELINE = {"queue/nomerges": "0", "queue/max_sectors_kb": "1280"}
JOURNAL = "lab.json"


# -- signals ----------------------------------------------------------------------------------


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so every context manager unwinds."""


def install_signal_handlers():
    """SIGINT and SIGTERM raise (KeyboardInterrupt / Terminated) once; later ones are ignored,
    so a second Ctrl-C cannot break the cleanup the first one started."""
    state = {"raised": False}

    def handler(signum, frame):
        if state["raised"]:
            print(
                f"\n>> {signal.Signals(signum).name} again: still cleaning up, please wait",
                flush=True,
            )
            return
        state["raised"] = True
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    for s in SIGNALS:
        signal.signal(s, handler)


@contextlib.contextmanager
def signals_deferred():
    """Block SIGINT/SIGTERM for the body (cleanup); a signal that arrived is delivered after it."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class CleanupStack(contextlib.ExitStack):
    """An ExitStack whose unwinding cannot be interrupted by SIGINT/SIGTERM."""

    def __exit__(self, *exc):
        with signals_deferred():
            return super().__exit__(*exc)


# -- the lab ----------------------------------------------------------------------------------


class Lab:
    """Loop devices, filesystems and sysfs settings for the scenarios; all undone on exit."""

    def __init__(self, say=print, root=LAB_ROOT):
        self.say, self.root = say, root
        self.dir = None
        self.disk_dir = None  # only if a scenario needs a device on the root disk
        self.devices = {}  # role -> /dev/loopN
        self.mounts = {}  # role -> mountpoint
        self.changed = []  # [(dev, attr, value before, value set)] of the settings changed now, in order
        self._es = None

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="blockstack-lab-", dir=self.root)
        self._save()
        self._es = CleanupStack()
        self._es.callback(self.sweep)
        try:
            self.devices["single"] = self.enter(loop.attached(SINGLE_SIZE, directory=self.dir))
            self.enter(self.pair("upper", "lower"))
            self.baseline("single")
        except BaseException:
            self._es.close()
            raise
        self.say(
            f"lab: {self.name('upper')} (direct-io, ext4 on {self.mounts['upper']}) on a file on ext4 on "
            f"{self.name('lower')}; {self.name('single')} alone; all backed by {self.dir}"
        )
        return self

    def __exit__(self, *exc):
        self.say("lab: cleaning up (restoring settings, unmounting, detaching)")
        return self._es.__exit__(*exc)

    def _save(self):
        """The journal: what `sweep_stale` needs to undo this lab if its process is killed (SIGKILL
        cannot be caught), and what a watcher needs to know of it."""
        path = os.path.join(self.dir, JOURNAL)
        with open(path + ".tmp", "w") as f:
            json.dump(
                {
                    "pid": os.getpid(),
                    "dir": self.dir,
                    "disk_dir": self.disk_dir,
                    "devices": self.devices,
                    "mounts": self.mounts,
                    "changed": [list(c) for c in self.changed],
                },
                f,
            )
        os.replace(path + ".tmp", path)

    def name(self, role):
        return loop.name(self.devices[role])

    def names(self):
        return {role: loop.name(dev) for role, dev in self.devices.items()}

    def enter(self, cm):
        """Keep a context (a scenario's extra device or filesystem) until the lab closes."""
        return self._es.enter_context(cm)

    def baseline(self, role):
        """Give a device the settings the scenarios start from, until the lab closes."""
        self.enter(self._baseline_cm(role))

    @contextlib.contextmanager
    def _baseline_cm(self, role):
        """The scenarios' starting settings for the body. A loop device keeps its queue settings
        after it is detached, so a free one may carry a previous user's nomerges=2; what was found
        is restored on exit."""
        with CleanupStack() as es:
            for attr, value in BASELINE.items():
                if loop.read_sysfs(self.devices[role], attr) != value:
                    es.enter_context(self.setting(role, attr, value))
            yield

    @contextlib.contextmanager
    def setting(self, role, attr, value):
        """/sys/block/DEV/ATTR = value for the body; the previous value back on exit (journaled,
        so the sweep restores it even if the body was interrupted mid-write)."""
        dev = self.devices[role]
        old = loop.read_sysfs(dev, attr)
        if "[" in old:  # queue/scheduler: "none [mq-deadline]" -> the one in use
            old = old.split("[", 1)[1].split("]", 1)[0]
        entry = (dev, attr, old, str(value))
        self.changed.append(entry)
        self._save()
        self.say(f"set {loop.name(dev)} {attr} {old} -> {value}")
        try:
            loop.write_sysfs(dev, attr, value)
            yield old
        finally:
            with signals_deferred():
                loop.write_sysfs(dev, attr, old)
                self.changed.remove(entry)
                self._save()
                self.say(f"restored {loop.name(dev)} {attr} {value} -> {old}")

    @contextlib.contextmanager
    def pair(
        self,
        upper,
        lower,
        sizes=(LOWER_SIZE, UPPER_SIZE),
        directory=None,
        sparse=False,
        mkfs_args=(),
        mount_options="",
    ):
        """Roles UPPER (direct-io, ext4 mounted) over a file on ext4 on LOWER: `loop.stacked_pair`
        with the lower's file in `directory` (default the lab's), mounts under the lab's directory
        and the baseline settings, for the body. Yields UPPER's mountpoint."""
        with CleanupStack() as es:
            self.devices[lower], self.devices[upper], self.mounts[lower] = es.enter_context(
                loop.stacked_pair(
                    *sizes, directory=directory or self.dir, mount_directory=self.dir, sparse=sparse
                )
            )
            self.mounts[upper] = es.enter_context(
                loop.ext4(
                    self.devices[upper],
                    [*loop.NO_DISCARD, *mkfs_args],
                    mount_options,
                    directory=self.dir,
                )
            )
            self._save()
            for role in (lower, upper):
                es.enter_context(self._baseline_cm(role))
            try:
                yield self.mounts[upper]
            finally:
                self.mounts.pop(upper, None)
                self.mounts.pop(lower, None)

    def journal_fs(self, role, journal_mib, mount_options=""):
        """A stacked pair on the root disk for one scenario: ROLE (direct-io, ext4 with a
        journal_mib MiB journal, mounted) over a sparse file on ext4 on ROLE-lower, a loop device
        over a sparse file in /var/tmp. An fsync on ROLE reaches the disk, so a journal that is too
        small makes its writers wait for checkpoints. Yields the mountpoint."""
        if self.disk_dir is None:
            self.disk_dir = tempfile.mkdtemp(prefix="blockstack-lab-", dir=DISK_ROOT)
            self._save()
        return self.pair(
            role,
            f"{role}-lower",
            (JOURNAL_LOWER_SIZE, JOURNAL_UPPER_SIZE),
            self.disk_dir,
            sparse=True,
            mkfs_args=["-J", f"size={journal_mib}"],
            mount_options=mount_options,
        )

    def sweep(self):
        """Undo whatever the context managers could not: settings journaled as changed, mounts
        under the lab directory, loop devices over its files; then remove the directory."""
        for dev, attr, old, _ in reversed(
            self.changed
        ):  # the last change first: the first's old value wins
            with contextlib.suppress(OSError):
                loop.write_sysfs(dev, attr, old)
                self.say(f"sweep: restored {loop.name(dev)} {attr} -> {old}")
        self.changed.clear()
        if not self.dir:
            return
        dirs = [d + "/" for d in (self.dir, self.disk_dir) if d]
        # which loop devices are ours, read before unmounting: a lazily unmounted filesystem's
        # files show as "/upper.img" in losetup afterwards
        ours = [
            (dev, back)
            for dev, back in loop.attached_devices().items()
            if back.startswith(tuple(dirs))
        ]
        mounts = lab_mounts(self.dir)
        for mnt in sorted(mounts, key=len, reverse=True):
            self.say(f"sweep: unmounting {mnt}")
            subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=60)
        # devices over files inside the lab's filesystems first (the uppers), then the lowers
        inner = tuple(m + "/" for m in mounts)
        for dev, _back in sorted(
            ours, key=lambda kv: not kv[1].startswith(inner) if inner else True
        ):
            self.say(f"sweep: detaching {dev}")
            with contextlib.suppress(subprocess.SubprocessError):
                loop.detach(dev)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def fio_tag(pid):
    return f"blockstack-lab-{pid}"


def fio_of(pid):
    """Pids of the fio processes a lab process `pid` started (named fio_tag(pid)-...)."""
    name = f"--name={fio_tag(pid)}-".encode()
    return [
        p
        for p, argv in procs.cmdlines()
        if os.path.basename(argv[0]) == b"fio" and any(a.startswith(name) for a in argv)
    ]


def sweep_stale(say=print, root=LAB_ROOT):
    """Undo labs whose process is gone (killed with SIGKILL, or the machine's OOM killer): restore
    their journaled settings, unmount, detach, remove. Labs of running processes are left alone.
    Returns the directories swept."""
    swept = []
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if not (name.startswith("blockstack-lab-") and os.path.isdir(d)):
            continue
        try:
            with open(os.path.join(d, JOURNAL)) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            continue  # not one of ours, or being created right now
        try:
            os.kill(saved["pid"], 0)
            continue  # its owner is alive and will clean up itself
        except ProcessLookupError:
            pass
        for pid in fio_of(saved["pid"]):
            say(f"sweep: stopping fio {pid}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        lab = Lab(say=say, root=root)
        lab.dir, lab.disk_dir = d, saved.get("disk_dir")
        lab.changed = [tuple(c) for c in saved.get("changed", [])]
        say(f"sweep: lab of dead process {saved['pid']} in {d}")
        lab.sweep()
        swept.append(d)
    return swept


def lab_mounts(directory):
    """Mountpoints under directory (from /proc/self/mountinfo)."""
    with open("/proc/self/mountinfo") as f:
        mounts, _ = parse_mountinfo(f.read())
    return [m.mountpoint for m in mounts if m.mountpoint.startswith(directory.rstrip("/") + "/")]
