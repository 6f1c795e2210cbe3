"""A lab collapse for the dashboard: a stacked pair of loop devices, the whole stack with Grafana
scraping them, and load in three phases, the last one held open while Grafana is looked at.

    upper (loopU, direct-io) -> file on ext4 -> lower (loopL) -> file on the root filesystem
    ext4 mounted on upper (the ext4/jbd2 panels' filesystem)

Phases (seconds, see PHASES):
  healthy   - fio sequential batched 4 KiB direct reads on upper: upper merges them into 256-sector
              requests and lower carries the same size.
  fsync     - fio random 4 KiB buffered writes with an fsync after each on the ext4 on upper:
              jbd2 transactions and credit waits.
  collapsed - the sequential reads again, with nomerges=2 and max_sectors_kb=4 on lower: lower
              serves 8-sector requests (the NVMe incident's signature). The context yields once
              BlockStackMergeCollapse* pages (ALERTS firing) for lower and its 20 s recording-rule
              window holds only collapsed samples; the collapse lasts until the context exits
              (at most HOLD seconds).

Prometheus scrapes and evaluates every 2 s here (5 s in production), so the run reaches the page
in about two minutes; the recording rules' 20 s windows still hold 10 samples. Everything is
undone on exit, also on failure: fio stopped, sysfs settings restored, filesystems unmounted,
loop devices detached, servers stopped.
"""

import contextlib
import os
import shutil
import time
import types

from blockstack_deploy.files import secret
from blockstack_deploy.stack import Stack
from blockstack_lab import fio, loop
from blockstack_lab.api import Prometheus
from blockstack_testsupport import procs

PHASES = {"healthy": 20, "fsync": 12}
HOLD = 420  # longest the collapsed phase lasts (a bound: the context normally exits long before)
SCRAPE_INTERVAL = "2s"
COMPONENTS = ("node", "blockstack", "ebpf", "prometheus", "grafana")
LOWER_SIZE = 512 << 20
UPPER_SIZE = 192 << 20
PAGE = 'ALERTS{alertname=~"BlockStackMergeCollapse.*", alertstate="firing", device="%s"}'
SETTLE = 22  # after the page, until the recording rules' 20 s windows hold collapsed samples only


def missing_requirements():
    """Why a lab run cannot happen here, or None."""
    problems = [] if os.geteuid() == 0 else ["needs root (loop devices, mounts, BPF)"]
    problems += [
        f"{tool} is not installed (run make deps)"
        for tool in ("fio", "losetup", "mkfs.ext4")
        if shutil.which(tool) is None
    ]
    problems += Stack("/nonexistent", components=COMPONENTS).missing()
    return "; ".join(problems) or None


@contextlib.contextmanager
def collapse(workdir, phases=PHASES, log=print, servers=None):
    """Yields a namespace, during the collapse: stack (the lab Stack: .url("grafana") ...), prometheus
    (its API client), grafana_password, upper and lower (kernel names), mountpoint, start, paged
    (Unix seconds), phases {name: (start, end)} (collapsed: (start, None) until end() ends it, before the
    context's exit if the caller wants to look at it afterwards), and refusing(), a context: the
    merging-refused collapse. servers: which Prometheus and
    Alertmanager (blockstack_deploy.stack.SERVERS; default $BLOCKSTACK_SERVERS, else Debian's)."""
    why = missing_requirements()
    if why:
        raise RuntimeError(why)
    with contextlib.ExitStack() as es:
        lower_dev, upper_dev, _ = es.enter_context(loop.stacked_pair(LOWER_SIZE, UPPER_SIZE))
        upper_mnt = es.enter_context(
            loop.ext4(upper_dev, mkfs_args=loop.NO_DISCARD + ["-J", "size=4"])
        )
        upper, lower = loop.name(upper_dev), loop.name(lower_dev)
        log(f">> lab: {upper} (ext4 on {upper_mnt}) on a file on ext4 on {lower}")

        stack = Stack(
            workdir,
            components=COMPONENTS,
            scrape_interval=SCRAPE_INTERVAL,
            evaluation_interval=SCRAPE_INTERVAL,
            servers=servers,
        )
        es.enter_context(stack.running(timeout=120))
        prometheus = Prometheus(stack.url("prometheus"))
        prometheus.wait_targets_up(timeout=60)
        time.sleep(4)  # two scrapes of the idle stack

        read = fio.SEQ_BATCHED_READ + [f"--filename={upper_dev}", "--readonly"]
        times = {}
        start = time.time()
        log(f">> lab: healthy phase, {phases['healthy']} s")
        fio.run(read, runtime=phases["healthy"], name="healthy")
        times["healthy"] = (start, time.time())
        log(f">> lab: fsync phase, {phases['fsync']} s")
        t = time.time()
        fio.run(
            [
                "--rw=randwrite",
                "--bs=4k",
                "--ioengine=psync",
                "--fsync=1",
                "--size=32m",
                "--numjobs=4",
                f"--directory={upper_mnt}",
                "--group_reporting",
            ],
            runtime=phases["fsync"],
            name="fsync",
        )
        times["fsync"] = (t, time.time())
        log(f">> lab: collapsed phase (nomerges=2, max_sectors_kb=4 on {lower}) until the page")
        collapsed = es.enter_context(contextlib.ExitStack())  # closed by end() or on exit
        collapsed.enter_context(loop.sysfs_setting(lower_dev, "queue/nomerges", "2"))
        collapsed.enter_context(loop.sysfs_setting(lower_dev, "queue/max_sectors_kb", "4"))
        t = time.time()
        collapsed.enter_context(fio.background(read, runtime=HOLD, name="collapsed"))
        times["collapsed"] = (t, None)

        def end():
            """Ends the collapse now (the reads stopped, the settings restored); the stack runs on."""
            if times["collapsed"][1] is None:
                collapsed.close()
                times["collapsed"] = (t, time.time())
                log(f">> lab: collapse ended after {times['collapsed'][1] - t:.0f} s")

        @contextlib.contextmanager
        def refusing():
            """A second collapse, merging refused, after end(): nomerges=2 on lower (max_sectors_kb as it
            was) under the batched reads of lower itself, whose plugged 4 KiB bios are each contiguous
            with the request before them (the first collapse refuses none: at max_sectors_kb=4 no merge
            would fit). Its phase is "refused" in phases."""
            end()
            log(f">> lab: refused-merges phase (nomerges=2 on {lower}, reads of {lower})")
            r = time.time()
            try:
                with (
                    loop.sysfs_setting(lower_dev, "queue/nomerges", "2"),
                    fio.background(
                        fio.SEQ_BATCHED_READ + [f"--filename={lower_dev}", "--readonly"],
                        runtime=HOLD,
                        name="refused",
                    ),
                ):
                    yield
            finally:
                times["refused"] = (r, time.time())

        procs.wait_until(
            f"the collapse page for {lower}", lambda: prometheus.query(PAGE % lower), 120, 2
        )
        paged = time.time()
        log(f">> lab: paged {paged - t:.0f} s after the flip")
        time.sleep(SETTLE)
        yield types.SimpleNamespace(
            stack=stack,
            prometheus=prometheus,
            grafana_password=secret(stack.grafana_password_file),
            upper=upper,
            lower=lower,
            mountpoint=upper_mnt,
            start=start,
            paged=paged,
            phases=times,
            end=end,
            refusing=refusing,
        )
