"""A lab run for the dashboard: a stacked pair of loop devices, the whole stack scraping them, and
three phases of load, so every panel's query has real data to return.

    upper (loopU, direct-io) -> file on ext4 -> lower (loopL) -> file on the root filesystem
    ext4 mounted on upper (the ext4/jbd2 panels' filesystem)

Phases (seconds, see PHASES):
  healthy   - fio sequential batched 4 KiB direct reads on upper: upper merges them into 256-sector
              requests and lower carries the same size.
  collapsed - the same load with nomerges=2 and max_sectors_kb=4 on lower: lower serves 8-sector
              requests (the NVMe incident's signature); BlockStackMergeCollapse fires.
  fsync     - fio random 4 KiB buffered writes with an fsync after each on the ext4 on upper:
              jbd2 transactions and credit waits.

Prometheus scrapes and evaluates every 2 s here (5 s in production) so the run stays under about
two and a half minutes; the recording rules' 20 s windows still hold 10 samples.
Everything is undone on exit, also on failure: fio is killed by its timeout, sysfs settings are
restored, filesystems unmounted, loop devices detached, servers stopped.
"""
import contextlib
import os
import shutil
import subprocess
import time
import types

from blockstack_lab import fio, loop
from blockstack_lab.stack import REPO, Stack

PHASES = {"healthy": 25, "collapsed": 45, "fsync": 20}
SCRAPE_INTERVAL = "2s"
COMPONENTS = ("node", "blockstack", "ebpf", "prometheus")
LOWER_SIZE = 512 << 20
UPPER_SIZE = 192 << 20


def missing_requirements():
    """Why a lab run cannot happen here, or None."""
    problems = [] if os.geteuid() == 0 else ["needs root (loop devices, mounts, BPF)"]
    problems += [f"{tool} is not installed (run make deps)" for tool in ("fio", "losetup", "mkfs.ext4")
                 if shutil.which(tool) is None]
    problems += Stack(REPO, components=COMPONENTS).missing()
    return "; ".join(problems) or None


def _fio(args, seconds, name):
    return fio.run(args, runtime=seconds, timeout=seconds + 60, name=name)


@contextlib.contextmanager
def lab_run(workdir, phases=PHASES, log=print):
    """Yields a namespace: stack, upper, lower (kernel names), mountpoint, start, end, phases
    {name: (start, end)} in Unix seconds. The stack keeps running until the context exits."""
    why = missing_requirements()
    if why:
        raise RuntimeError(why)
    with contextlib.ExitStack() as es:
        lower_dev = es.enter_context(loop.attached(LOWER_SIZE))
        lower_mnt = es.enter_context(loop.ext4(lower_dev, mkfs_args=loop.NO_DISCARD))
        backing = os.path.join(lower_mnt, "upper.img")
        loop.fill(backing, UPPER_SIZE)
        upper_dev = es.enter_context(loop.attached(path=backing, direct_io=True))
        upper_mnt = es.enter_context(loop.ext4(upper_dev, mkfs_args=loop.NO_DISCARD + ["-J", "size=4"]))
        upper, lower = loop.name(upper_dev), loop.name(lower_dev)
        log(f">> lab: {upper} (ext4 on {upper_mnt}) on a file on ext4 on {lower}")

        stack = Stack(workdir, components=COMPONENTS, scrape_interval=SCRAPE_INTERVAL,
                         evaluation_interval=SCRAPE_INTERVAL)
        es.enter_context(stack.running(timeout=120))
        stack.wait_targets_up(timeout=60)
        time.sleep(4)  # two scrapes of the idle stack

        read = fio.SEQ_BATCHED_READ + [f"--filename={upper_dev}", "--readonly"]
        times = {}
        start = time.time()
        if "healthy" in phases:
            log(f">> lab: healthy phase, {phases['healthy']} s")
            t = time.time()
            _fio(read, phases["healthy"], "healthy")
            times["healthy"] = (t, time.time())
        if "collapsed" in phases:
            log(f">> lab: collapsed phase, {phases['collapsed']} s (nomerges=2, max_sectors_kb=4 on {lower})")
            with loop.sysfs_setting(lower_dev, "queue/nomerges", "2"), \
                    loop.sysfs_setting(lower_dev, "queue/max_sectors_kb", "4"):
                t = time.time()
                _fio(read, phases["collapsed"], "collapsed")
                times["collapsed"] = (t, time.time())
                time.sleep(4)  # let the exporter scrape the settings once more
        if "fsync" in phases:
            log(f">> lab: fsync phase, {phases['fsync']} s")
            t = time.time()
            _fio(["--rw=randwrite", "--bs=4k", "--ioengine=psync", "--fsync=1", "--size=32m", "--numjobs=4",
                  f"--directory={upper_mnt}", "--group_reporting"], phases["fsync"], "fsync")
            times["fsync"] = (t, time.time())
        time.sleep(6)  # three more scrapes and rule evaluations
        end = time.time()
        subprocess.run(["sync"], timeout=60)
        yield types.SimpleNamespace(stack=stack, upper=upper, lower=lower, mountpoint=upper_mnt,
                                    start=start, end=end, phases=times)
