#!/usr/bin/env python3
"""Scrape time of blockstack-exporter vs node_exporter's diskstats on one synthetic tree.

    bench_scrape.py [--devices 1024] [--rounds 40] [--scale 100,1000,4000,10000] [--scale-rounds 6]
                    [--against REV] [--without CACHE[+CACHE],...|all]

Generates a sysfs/procfs tree of N block devices (NVMe disks with a partition each, LVM
linear volumes on the partitions, snapshot stacks with -real/-cow layers, ext4 mounted on the
volumes with jbd2 journals), starts both exporters on it, scrapes them alternately over HTTP
and prints the median scrape time of each, the CPU time each scrape cost each process (steadier
than wall time on a shared machine), and their ratios; then the same at 100, 1,000, 4,000 and
10,000 devices (scrape time, CPU, RSS, bytes, series): the cost per device should stay flat.
A benchmark, not a test: the figure depends on the machine, so both sides are measured in the
same run.

Other exporters can join the same rounds, each scraped once per round, and are compared with the
current tree's: --against REV runs the exporter of a git revision (a temporary worktree, on this
venv's Python and libraries) and prints current / REV; --without CACHE runs the current exporter
with that cache taken out (without_cache.py, a wrapper only the benchmark uses) and prints what
the cache is worth: how much more CPU a scrape costs without it.
"""

import argparse
import contextlib
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from without_cache import CACHES

from blockstack_exporter.collectors.queue import FILES as QUEUE_FILES
from blockstack_testsupport import procs

HERE = os.path.dirname(os.path.abspath(__file__))
EXPORTER = os.path.join(os.path.dirname(sys.executable), "blockstack-exporter")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
# Every disk's queue/ is a copy of a real one: the recorded fixture's virtio disk, each file the
# queue collector reads.
FIXTURE_QUEUE = os.path.join(
    os.path.dirname(HERE),
    "tests",
    "fixtures",
    "host-loop",
    "sys",
    "block",
    "vda",
    "queue",
)
EXT4_OPTIONS = "rw\nbsddf\nnogrpid\nblock_validity\ndioread_nolock\nnodiscard\ndelalloc\nbarrier\ndata=ordered\ncommit=5\n"
JBD2_INFO = """120 transactions (118 requested), each up to 8192 blocks
average: 
  0ms waiting for transaction
  0ms request delay
  4780ms running transaction
  0ms transaction was being locked
  0ms flushing data (in ordered mode)
  0ms logging transaction
  11798us average transaction commit time
  30 handles per transaction
  4 blocks per transaction
  5 logged blocks per transaction
"""


def superblock(journal_bytes):
    """The first 2 KiB of an ext4 device whose journal inode backup says journal_bytes."""
    sb = bytearray(2048)
    struct.pack_into("<H", sb, 1024 + 0x38, 0xEF53)  # s_magic
    struct.pack_into("<I", sb, 1024 + 0xE0, 8)  # s_journal_inum
    sb[1024 + 0xFD] = 1  # s_jnl_backup_type = EXT3_JNL_BACKUP_BLOCKS
    struct.pack_into(
        "<II", sb, 1024 + 0x10C + 15 * 4, journal_bytes >> 32, journal_bytes & 0xFFFFFFFF
    )
    return bytes(sb)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def link(path, target):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


class Tree:
    def __init__(self, root):
        self.root, self.sys, self.proc = root, os.path.join(root, "sys"), os.path.join(root, "proc")
        self.diskstats, self.mountinfo, self.dm_table, self.dm_status = [], [], [], []
        self.count = 0

    def device(self, name, devpath, major, minor, parent=None, slaves=(), dm=None):
        """A device at sys/devices/DEVPATH (a partition inside its disk's directory)."""
        d = os.path.join(self.sys, "devices", devpath)
        write(os.path.join(d, "dev"), f"{major}:{minor}\n")
        write(os.path.join(d, "size"), "2097152\n")
        rel = os.path.join("../../devices", devpath)
        link(os.path.join(self.sys, "class/block", name), rel)
        link(os.path.join(self.sys, "dev/block", f"{major}:{minor}"), rel)
        if parent:
            write(os.path.join(d, "partition"), "1\n")
        else:
            link(os.path.join(self.sys, "block", name), os.path.join("../devices", devpath))
            os.makedirs(os.path.join(d, "queue"))
            for f in QUEUE_FILES:
                shutil.copyfile(os.path.join(FIXTURE_QUEUE, f), os.path.join(d, "queue", f))
            os.makedirs(os.path.join(d, "holders"), exist_ok=True)
            os.makedirs(os.path.join(d, "slaves"), exist_ok=True)
            for s in slaves:
                link(os.path.join(d, "slaves", s), f"../../{s}")
        if dm:
            write(os.path.join(d, "dm", "name"), dm[0] + "\n")
            write(os.path.join(d, "dm", "uuid"), dm[1] + "\n")
        self.diskstats.append(
            f"{major:4d} {minor:7d} {name} 1200 30 96000 400 800 20 64000 900 0 1300 1300 0 0 0 0 10 5"
        )
        self.count += 1


def generate(root, n):
    t = Tree(root)
    dm_minor = 0
    i = 0
    while t.count < n:
        disk, part = f"nvme{i}n1", f"nvme{i}n1p1"
        t.device(disk, f"pci0000:00/nvme/nvme{i}/{disk}", 259, 2 * i)
        t.device(part, f"pci0000:00/nvme/nvme{i}/{disk}/{part}", 259, 2 * i + 1, parent=disk)
        vg = f"vg{i}"
        if i % 2 == 0:  # a plain LV with ext4
            lv = f"dm-{dm_minor}"
            t.device(
                lv,
                f"virtual/block/{lv}",
                253,
                dm_minor,
                slaves=[part],
                dm=(f"{vg}-data", f"LVM-{i:032d}"),
            )
            t.dm_table.append(f"{vg}-data: 0 2097152 linear 259:{2 * i + 1} 2048")
            t.dm_status.append(f"{vg}-data: 0 2097152 linear ")
            t.mountinfo.append(
                f"{100 + i} 1 253:{dm_minor} / /srv/{vg} rw,relatime - ext4 /dev/mapper/{vg}-data rw"
            )
            write(os.path.join(t.proc, "fs/ext4", lv, "options"), EXT4_OPTIONS)
            write(os.path.join(t.proc, "fs/jbd2", f"{lv}-8", "info"), JBD2_INFO)
            os.makedirs(os.path.join(root, "dev"), exist_ok=True)
            with open(os.path.join(root, "dev", lv), "wb") as f:
                f.write(superblock(128 << 20))
            dm_minor += 1
        else:  # origin + snapshot: -real, -cow, origin, snapshot (the NVMe incident's shape)
            real, cow, origin, snap = (f"dm-{dm_minor + k}" for k in range(4))
            t.device(
                real,
                f"virtual/block/{real}",
                253,
                dm_minor,
                slaves=[part],
                dm=(f"{vg}-lv-real", f"LVM-{i:032d}-real"),
            )
            t.device(
                cow,
                f"virtual/block/{cow}",
                253,
                dm_minor + 1,
                slaves=[part],
                dm=(f"{vg}-snap-cow", f"LVM-{i:032d}-cow"),
            )
            t.device(
                origin,
                f"virtual/block/{origin}",
                253,
                dm_minor + 2,
                slaves=[real],
                dm=(f"{vg}-lv", f"LVM-{i:032d}"),
            )
            t.device(
                snap,
                f"virtual/block/{snap}",
                253,
                dm_minor + 3,
                slaves=[real, cow],
                dm=(f"{vg}-snap", f"LVM-{i:032d}s"),
            )
            t.dm_table += [
                f"{vg}-lv-real: 0 2097152 linear 259:{2 * i + 1} 2048",
                f"{vg}-snap-cow: 0 409600 linear 259:{2 * i + 1} 2099200",
                f"{vg}-lv: 0 2097152 snapshot-origin 253:{dm_minor}",
                f"{vg}-snap: 0 2097152 snapshot 253:{dm_minor} 253:{dm_minor + 1} P 8",
            ]
            t.dm_status += [
                f"{vg}-lv-real: 0 2097152 linear ",
                f"{vg}-snap-cow: 0 409600 linear ",
                f"{vg}-lv: 0 2097152 snapshot-origin ",
                f"{vg}-snap: 0 2097152 snapshot 2048/409600 16",
            ]
            dm_minor += 4
        i += 1
    write(os.path.join(t.proc, "diskstats"), "\n".join(t.diskstats) + "\n")
    write(os.path.join(t.proc, "self", "mountinfo"), "\n".join(t.mountinfo) + "\n")
    os.makedirs(os.path.join(root, "udev"), exist_ok=True)
    # dmsetup stand-in: prints the synthetic table/status like the real one would
    for cmd, lines in (("table", t.dm_table), ("status", t.dm_status)):
        write(os.path.join(root, f"dmsetup_{cmd}"), "\n".join(lines) + "\n")
    fake = os.path.join(root, "dmsetup")
    write(fake, f'#!/bin/sh\nexec cat "{root}/dmsetup_$1"\n')
    os.chmod(fake, 0o755)
    return t.count


def time_scrape(url, tries=3):
    """Seconds for one scrape and its body. A connection dropped before the answer (seen under
    load 15 on the shared VM) is tried again and said so."""
    for attempt in range(tries):
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                body = r.read()
            return time.perf_counter() - start, body
        except (ConnectionError, urllib.error.URLError) as e:
            if attempt == tries - 1:
                raise
            print(f"  {url}: {e!r}; scraping again", flush=True)


def cpu_seconds(pid):
    """utime + stime of a process (its threads included), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def series(body):
    return sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))


def exporter_flags(root, port):
    return [
        f"--web.listen-address=127.0.0.1:{port}",
        f"--path.sysfs={root}/sys",
        f"--path.procfs={root}/proc",
        f"--path.dev={root}/dev",
        f"--collector.dm.dmsetup={root}/dmsetup",
        "--log.level=error",
        "--web.default-scrape-timeout=60",
    ]


def node_exporter_argv(root, port):
    return [
        NODE_EXPORTER,
        f"--web.listen-address=127.0.0.1:{port}",
        "--collector.disable-defaults",
        "--collector.diskstats",
        r"--collector.diskstats.device-exclude=^(ram|fd|sr)\d+$",
        f"--path.procfs={root}/proc",
        f"--path.sysfs={root}/sys",
        f"--path.udev.data={root}/udev",
    ]


class Side:
    """One blockstack-exporter to measure: how it is started (before its flags) and its env."""

    def __init__(self, label, command=(EXPORTER,), env=None, cache=None):
        self.label, self.command, self.env, self.cache = label, list(command), env, cache


CURRENT = Side("blockstack-exporter (all collectors)")


def measure(root, rounds, warmup=3, exporters=(CURRENT,)):
    """The exporters and node_exporter (last) on one tree, each round scraping each once, who goes
    first rotating: per side the scrape times, the CPU seconds each scrape cost the exporter's
    process, and after the run its RSS, the body's bytes and series."""
    ports = [procs.free_port() for _ in range(len(exporters) + 1)]
    argvs = [side.command + exporter_flags(root, port) for side, port in zip(exporters, ports)]
    argvs.append(node_exporter_argv(root, ports[-1]))
    envs = [side.env for side in exporters] + [None]
    urls = [f"http://127.0.0.1:{port}/metrics" for port in ports]
    out = [{"wall": [], "cpu": []} for _ in ports]
    with contextlib.ExitStack() as stack:
        # started when the landing page answers: a first collection of 10,000 devices takes
        # longer than the health check's 2 s per attempt
        pids = [
            stack.enter_context(
                procs.running(argv, env=env, health_url=url[: -len("metrics")], timeout=120)
            ).pid
            for argv, env, url in zip(argvs, envs, urls)
        ]
        for _ in range(warmup):
            for url in urls:
                time_scrape(url)
        sides = list(range(len(ports)))
        for i in range(rounds):
            for side in sides[i % len(sides) :] + sides[: i % len(sides)]:
                cpu = cpu_seconds(pids[side])
                t, body = time_scrape(urls[side])
                out[side]["cpu"].append(cpu_seconds(pids[side]) - cpu)
                out[side]["wall"].append(t)
                out[side]["body"] = body
        for side, pid in zip(out, pids):
            side["rss"] = rss_bytes(pid)
    return out


def report(n, rounds, out):
    (a, b) = out[0], out[-1]
    ma, mb = statistics.median(a["wall"]), statistics.median(b["wall"])
    # clock ticks: a mean, not a median
    ca, cb = statistics.mean(a["cpu"]), statistics.mean(b["cpu"])
    paired = statistics.median(x / y for x, y in zip(a["wall"], b["wall"]))
    print(
        f"synthetic tree: {n} block devices, {rounds} alternating scrapes each "
        f"({time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.1f})"
    )
    print(
        f"blockstack-exporter (all collectors): median {ma * 1e3:7.1f} ms, "
        f"CPU {ca * 1e3:6.1f} ms/scrape ({len(a['body']) / 1024:.0f} KiB, "
        f"{series(a['body'])} series, RSS {a['rss'] >> 20} MiB)"
    )
    print(
        f"node_exporter diskstats only:         median {mb * 1e3:7.1f} ms, "
        f"CPU {cb * 1e3:6.1f} ms/scrape ({len(b['body']) / 1024:.0f} KiB, "
        f"{series(b['body'])} series, RSS {b['rss'] >> 20} MiB)"
    )
    print(
        f"ratio blockstack/node_exporter: {ma / mb:.2f}x of the medians, {paired:.2f}x median of "
        f"the {rounds} back-to-back pairs, {f'{ca / cb:.2f}x' if cb else 'n/a'} of CPU per scrape "
        "(goal <= 1.0x)",
        flush=True,
    )


def report_others(exporters, out, rounds):
    """Each other exporter of the run against the current tree's, in CPU and wall time per
    scrape. A cache's worth is how much more a scrape costs without it (without / with - 1)."""
    if len(exporters) < 2:
        return
    a = out[0]
    ca, ma = statistics.mean(a["cpu"]), statistics.median(a["wall"])
    print(f"against the current tree's exporter ({rounds} rounds, load {os.getloadavg()[0]:.1f}):")
    print(
        "| exporter | median ms | CPU ms/scrape | series | current / this, CPU | medians "
        "| median pair |"
    )
    print("|---|---|---|---|---|---|---|")
    for side, b in zip(exporters, out):
        cb, mb = statistics.mean(b["cpu"]), statistics.median(b["wall"])
        paired = statistics.median(x / y for x, y in zip(a["wall"], b["wall"]))
        print(
            f"| {side.label} | {mb * 1e3:.1f} | {cb * 1e3:.1f} | {series(b['body']):,} | "
            f"{f'{ca / cb:.3f}x' if cb else 'n/a'} | {ma / mb:.3f}x | {paired:.3f}x |"
        )
    for side, b in zip(exporters[1:], out[1:]):
        if side.cache:
            cb = statistics.mean(b["cpu"])
            print(
                f"{side.cache} ({'; '.join(CACHES[c][0] for c in side.cache.split('+'))}): worth {(cb / ca - 1) * 100:.0f} % of "
                f"CPU per scrape ({cb * 1e3:.1f} ms without, {ca * 1e3:.1f} ms with)"
            )
    print(flush=True)


@contextlib.contextmanager
def worktree(rev):
    """A checkout of rev in a temporary git worktree (removed afterwards) and the PYTHONPATH that
    makes this venv's python run its exporter."""
    top = subprocess.run(
        ["git", "-C", HERE, "rev-parse", "--show-toplevel"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    path = tempfile.mkdtemp(prefix="blockstack-bench-base-")
    try:
        added = subprocess.run(
            ["git", "-C", top, "worktree", "add", "--detach", path, rev],
            stdout=subprocess.DEVNULL,
        )
        if added.returncode:
            sys.exit(f"--against {rev}: git worktree add failed")
        pythonpath = os.pathsep.join(os.path.join(path, d) for d in ("exporters", "httpd"))
        found = subprocess.run(
            [sys.executable, "-c", "import blockstack_exporter as e; print(e.__file__)"],
            env=dict(os.environ, PYTHONPATH=pythonpath),
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if not found.startswith(path + os.sep):
            sys.exit(f"--against {rev}: python imports {found}, not the worktree's exporter")
        yield pythonpath
    finally:
        subprocess.run(
            ["git", "-C", top, "worktree", "remove", "--force", path],
            check=False,
            stderr=subprocess.DEVNULL,
        )
        shutil.rmtree(path, ignore_errors=True)


def scale(sizes, rounds):
    """The same at several tree sizes: cost per device should stay flat."""
    rows = []
    for n in sizes:
        root = tempfile.mkdtemp(prefix="blockstack-bench-")
        try:
            n = generate(root, n)
            out = measure(root, rounds, warmup=2)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        a, b = out
        rows.append(
            (
                n,
                statistics.median(a["wall"]),
                statistics.mean(a["cpu"]),
                a["rss"],
                len(a["body"]),
                series(a["body"]),
                statistics.median(b["wall"]),
                statistics.mean(b["cpu"]),
                b["rss"],
                len(b["body"]),
                series(b["body"]),
            )
        )
        print(f"  {n} devices done", flush=True)
    print(f"scale ({rounds} alternating scrapes per size, load {os.getloadavg()[0]:.1f}):")
    print(
        "| devices | blockstack ms | CPU ms | CPU µs/device | RSS MiB | KiB | series | node_exporter ms | CPU ms | "
        "CPU µs/device | RSS MiB | KiB | series | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, wa, ca, ra, ba, sa, wb, cb, rb, bb, sb in rows:
        print(
            f"| {n:,} | {wa * 1e3:.1f} | {ca * 1e3:.1f} | {ca / n * 1e6:.1f} | {ra >> 20} | {ba >> 10:,} | {sa:,} | "
            f"{wb * 1e3:.1f} | {cb * 1e3:.1f} | {cb / n * 1e6:.1f} | {rb >> 20} | {bb >> 10:,} | {sb:,} | "
            f"{wa / wb:.2f}x |",
            flush=True,
        )


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--devices", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument(
        "--scale",
        default="100,1000,4000,10000",
        help="device counts of the scale curve, comma-separated ('' for none)",
    )
    p.add_argument(
        "--scale-rounds", type=int, default=6, help="alternating scrapes per size of the curve"
    )
    p.add_argument(
        "--against",
        metavar="REV",
        help="also run the exporter of git revision REV (a temporary worktree) in the same rounds",
    )
    p.add_argument(
        "--without",
        metavar="CACHE,...",
        default="",
        help="also run the exporter without each cache named, or without several at once "
        f"(A+B); 'all' runs one without each of {', '.join(CACHES)}",
    )
    args = p.parse_args()
    if not NODE_EXPORTER:
        sys.exit("node_exporter not found (apt-get install prometheus-node-exporter)")
    caches = [
        c for name in args.without.split(",") if name for c in (CACHES if name == "all" else [name])
    ]
    for cache in caches:
        if not set(cache.split("+")) <= set(CACHES):
            sys.exit(f"--without {cache}: no such cache (one of {', '.join(CACHES)})")
    exporters = [CURRENT]
    exporters += [
        Side(f"without {c}", [sys.executable, os.path.join(HERE, "without_cache.py"), c], cache=c)
        for c in caches
    ]
    with contextlib.ExitStack() as stack:
        if args.against:
            pythonpath = stack.enter_context(worktree(args.against))
            exporters.append(
                Side(
                    f"at {args.against}",
                    [sys.executable, "-m", "blockstack_exporter"],
                    env={"PYTHONPATH": pythonpath},
                )
            )
        root = tempfile.mkdtemp(prefix="blockstack-bench-")
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        n = generate(root, args.devices)
        out = measure(root, args.rounds, exporters=exporters)
        report(n, args.rounds, out)
        report_others(exporters, out, args.rounds)
    if args.scale:
        scale([int(x) for x in args.scale.split(",")], args.scale_rounds)


if __name__ == "__main__":
    main()
