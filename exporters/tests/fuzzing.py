"""End-to-end fuzzing of the real exporter: damage the files and commands it reads, scrape it
over HTTP, check the answer, undo the damage. Used by test_fuzz.py (short, in make test) and
exporters/bench/fuzz_exporter.py (>= 10,000 iterations, make fuzz-exporter).

Every file the exporter reads in exporter_testlib.full_tree (sysfs attributes and links, device
names, mountinfo, ext4 options, jbd2 info, superblocks) and both dmsetup commands are targets.
A damage is one of: random bytes, huge (more than any bound), bytes that are not UTF-8, a
64-bit-overflowing integer of hundreds or thousands of digits, deleted, a symlink loop; for a
name: renamed to bytes that are not UTF-8; for a command: random output, huge output, failing,
hanging. Checks per scrape: HTTP 200, a parseable exposition (promtool check metrics where
asked), the time, the exporter's RSS, and that a damage which drops a value (or makes a read
fail) raised blockstack_collector_errors_total.

Damaged requests (test_hardening.py, and fuzz_exporter.py's HTTP abuse): ABORTED, HALF_SENT and
SLOW, sent by damaged_request().
"""

import os
import random
import re
import shutil
import socket
import subprocess
import time
import urllib.parse

from exporter_testlib import DM_DEVICES, Scraped, exporter_argv, full_tree, http

from blockstack_exporter.settings import SETTINGS

# (path relative to the tree, kind): numeric attributes re-read every scrape drop a value when
# damaged; other files are read too, but a damage there need not drop anything (a device
# number is only compared, the limits and a superblock are read once per device or mount).
WRITABLE = tuple(s.file for s in SETTINGS if not s.fixed)
FIXED = tuple(s.file for s in SETTINGS if s.fixed)


def targets():
    out = []
    for dev in ("loop0", "loop1", "dm-0", "dm-3"):
        queue = f"sys/devices/virtual/block/{dev}/queue"
        out += [(f"{queue}/{f}", "number") for f in WRITABLE]
        out += [(f"{queue}/{f}", "file") for f in FIXED]
        out += [(f"{queue}/scheduler", "text"), (f"sys/devices/virtual/block/{dev}/dev", "file")]
    for dev in DM_DEVICES:
        out += [
            (f"sys/devices/virtual/block/{dev}/dm/name", "text"),
            (f"sys/devices/virtual/block/{dev}/dm/uuid", "text"),
            (f"sys/devices/virtual/block/{dev}/slaves", "dir"),
        ]
    out += [
        ("sys/devices/virtual/block/loop1/loop/backing_file", "text"),
        ("proc/self/mountinfo", "text"),
        ("proc/fs/ext4/loop0/options", "text"),
        ("proc/fs/ext4/loop1/options", "text"),
        ("proc/fs/jbd2/loop0-8/info", "info"),
        ("proc/fs/jbd2/loop1-8/info", "info"),
        ("dev/loop0", "file"),
        ("dev/loop1", "file"),
        ("sys/class/block/loop1", "name"),
        ("sys/class/block/dm-2", "name"),
        ("proc/fs/ext4/loop0", "name"),
        ("proc/fs/jbd2/loop1-8", "name"),
        ("dmsetup_table", "command"),
        ("dmsetup_status_--noflush", "command"),
    ]
    return out


TARGETS = targets()
DAMAGES = ("random", "huge", "not_utf8", "big_integer", "deleted", "symlink_loop")
COMMAND_DAMAGES = ("random", "huge", "not_utf8", "fail", "hang")
HUGE = {"command": 9 << 20, "default": 2 << 20}  # past dmsetup's bound, past every file's bound


def must_count(path, kind, damage):
    """Whether this damage must show in errors_total (it drops a value or fails a read)."""
    if kind in ("file", "dir"):
        return False  # read once per identity/mount, or only compared
    if damage == "deleted":
        return False  # a device, a filesystem or a feature that is not there: nothing dropped
    if damage == "symlink_loop" and path.startswith("sys/"):
        return False  # a sysfs attribute kept open reads on (in sysfs itself it could not happen)
    if kind in ("name", "command", "number", "info"):
        return True
    return damage in ("huge", "symlink_loop")  # text: garbage may still be a valid word


def payload(rng, damage, kind):
    """Bytes for a damage: random bytes start with a byte no kernel value starts with, so they
    are always a bad value where a value is parsed."""
    if damage == "random":
        return b"\x01 " + rng.randbytes(rng.randint(0, 200))
    if damage == "not_utf8":
        return b"\xff\xfe" + rng.randbytes(rng.randint(0, 40)) + b"\n"
    if damage == "big_integer":
        return str(rng.randint(1, 9)).encode() * rng.choice((310, 400, 4301, 5000)) + b"\n"
    if damage == "huge":
        size = HUGE["command"] if kind == "command" else HUGE["default"]
        return b"\x01 garbage line\n" * (size // 15 + 1)
    raise ValueError(damage)


class Fuzzer:
    """One exporter over a private full tree; damage(), scrape, undo() per iteration."""

    def __init__(self, base, seed=0):
        self.base = base
        self.tree, self.fixtures = full_tree(base)
        # dmsetup's output is damaged behind the kernel's back: a control node that always polls
        # readable (as before Linux 4.14) makes the exporter run `dmsetup table` on every scrape
        os.makedirs(os.path.join(self.tree, "dev", "mapper"))
        open(os.path.join(self.tree, "dev", "mapper", "control"), "w").close()
        self.rng = random.Random(seed)
        self.log_path = os.path.join(base, "exporter.log")
        self.stats = {
            "iterations": 0,
            "http_non_200": 0,
            "slowest": 0.0,
            "peak_rss": 0,
            "log_lines": 0,
            "uncounted": 0,
            "promtool_runs": 0,
            "promtool_failures": 0,
            "parse_failures": 0,
            "failures": [],
        }

    def argv(self, port):
        return exporter_argv(self.tree, port, "--log.level=info")

    def env(self):
        return {"FAKE_DMSETUP_FIXTURES": self.fixtures}

    # -- damage and undo --------------------------------------------------------------------------

    def _path(self, rel, kind):
        return os.path.join(self.fixtures if kind == "command" else self.tree, rel)

    def damage(self, target, damage, rng=None):
        """Apply a damage; returns its undo function."""
        rng = rng or self.rng
        rel, kind = target
        path = self._path(rel, kind)
        if kind == "command":
            mode_file = os.path.join(self.fixtures, "mode")
            if damage in ("fail", "hang"):
                with open(mode_file, "w") as f:
                    f.write(f"{damage} {rel.split('_')[1]}\n")
                return lambda: os.unlink(mode_file)
            return self._replace_file(path, payload(rng, damage, kind))
        if kind == "name":
            parent, name = os.path.split(path)
            bad = os.path.join(os.fsencode(parent), os.fsencode(name) + b"\xff")
            if damage == "deleted":
                aside = path + ".aside"
                os.rename(path, aside)
                return lambda: os.rename(aside, path)
            os.rename(path, bad)
            return lambda: os.rename(bad, path)
        if damage == "deleted" or damage == "symlink_loop":
            aside = path + ".aside"
            os.rename(path, aside)
            if damage == "symlink_loop":
                os.symlink(os.path.basename(path), path)

            def undo():
                if os.path.lexists(path):
                    os.unlink(path)
                os.rename(aside, path)

            return undo
        if kind == "dir":
            return self._replace_dir(path, rng)
        return self._replace_file(path, payload(rng, damage, kind))

    @staticmethod
    def _replace_file(path, data):
        """Rewritten in place: the exporter keeps sysfs attributes open between scrapes, and a
        kept descriptor of a replaced file would go on reading the old one."""
        with open(path, "rb") as f:
            original = f.read()
        with open(path, "r+b") as f:
            f.truncate()
            f.write(data)

        def undo():
            with open(path, "r+b") as f:
                f.truncate()
                f.write(original)

        return undo

    @staticmethod
    def _replace_dir(path, rng):
        """A slaves/ directory with entries whose names are not UTF-8 or point nowhere."""
        aside = path + ".aside"
        os.rename(path, aside)
        os.makedirs(path)
        for i in range(rng.randint(1, 5)):
            os.symlink(
                f"../../nowhere{i}", os.path.join(os.fsencode(path), b"x\xff" + str(i).encode())
            )

        def undo():
            shutil.rmtree(path)
            os.rename(aside, path)

        return undo

    # -- one iteration ----------------------------------------------------------------------------

    def choose(self, rng=None):
        rng = rng or self.rng
        chosen = []
        for target in rng.sample(TARGETS, rng.randint(1, 3)):
            damages = COMMAND_DAMAGES if target[1] == "command" else DAMAGES
            damage = rng.choice(damages)
            if damage == "hang" and rng.random() > 0.05:
                damage = "fail"  # hangs cost the dm deadline each: keep them rare
            chosen.append((target, damage))
        return chosen

    def iteration(self, url, pid, chosen, promtool=True, rng=None):
        """Damage, scrape, check, undo. Returns a list of failure descriptions (empty: fine)."""
        log_before = self._log_lines()
        undo = []
        # names last: a file inside a renamed directory is damaged before the rename
        chosen = sorted(chosen, key=lambda c: c[0][1] == "name")
        try:
            for target, damage in chosen:
                undo.append(self.damage(target, damage, rng))
            status, body, seconds = http(url + "/metrics", timeout=30)
        finally:
            for u in reversed(undo):
                u()
        problems = []
        self.stats["iterations"] += 1
        self.stats["slowest"] = max(self.stats["slowest"], seconds)
        self.stats["peak_rss"] = max(self.stats["peak_rss"], self._rss(pid))
        if status != 200:
            self.stats["http_non_200"] += 1
            problems.append(f"HTTP {status}")
        else:
            try:
                errors = Scraped(body).errors()
            except Exception as e:
                self.stats["parse_failures"] += 1
                problems.append(f"unparseable exposition: {e!r}")
                errors = None
            if promtool:
                self.stats["promtool_runs"] += 1
                r = subprocess.run(
                    ["promtool", "check", "metrics"],
                    input=body,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                if r.returncode != 0:
                    self.stats["promtool_failures"] += 1
                    problems.append("promtool: " + (r.stdout + r.stderr)[:300])
            if errors is not None:
                self._check_counted(chosen, errors, problems)
        self.stats["log_lines"] += self._log_lines() - log_before
        if problems:
            self.stats["failures"].append((chosen, problems))
        return problems

    def _check_counted(self, chosen, errors, problems):
        counted = errors - self.errors_total - self.baseline
        self.errors_total = errors
        # a renamed directory whose file inside was deleted publishes nothing: nothing to drop
        deleted = [t[0] for t, d in chosen if d == "deleted"]
        expected = [
            (t, d)
            for t, d in chosen
            if not (t[1] == "name" and any(p.startswith(t[0] + "/") for p in deleted))
        ]
        if any(must_count(t[0], t[1], d) for t, d in expected) and counted < 1:
            self.stats["uncounted"] += 1
            problems.append(f"nothing counted (errors_total +{counted:g} over the baseline)")

    def calibrate(self, url):
        """errors_total counted by one scrape of the undamaged tree (the fixture has one: vda's
        superblock is not in it)."""
        before = Scraped(http(url + "/metrics")[1]).errors()
        self.errors_total = Scraped(http(url + "/metrics")[1]).errors()
        self.baseline = self.errors_total - before

    def _log_lines(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().count(b"\n")
        except FileNotFoundError:
            return 0

    @staticmethod
    def _rss(pid):
        with open(f"/proc/{pid}/status") as f:
            m = re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M)
        return int(m[1]) << 10 if m else 0


def timed(fn):
    start = time.monotonic()
    fn()
    return time.monotonic() - start


# Requests that never become a scrape
ABORTED = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"  # closed before any answer
HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"  # headers never finished, then closed
SLOW = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "  # a header never finished, kept open


def damaged_request(url, data, keep_open=False):
    """A connection to the exporter at `url` that sends `data` and closes, or is returned open."""
    where = urllib.parse.urlsplit(url)
    s = socket.create_connection((where.hostname, where.port), timeout=5)
    s.sendall(data)
    if keep_open:
        return s
    s.close()


def closed_by_exporter(connections, timeout):
    """How many of the connections kept open the exporter has closed; closes them all."""
    closed = 0
    for s in connections:
        s.settimeout(timeout)
        try:
            closed += s.recv(1) == b""
        except OSError:
            closed += 1
        s.close()
    return closed
