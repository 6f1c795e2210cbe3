"""Named lab scenarios: real incidents reproduced on loop devices, and healthy I/O that must stay
quiet, each narrated as the stack sees it (the lineup per layer, the alert state, the page).

The lab (`Lab`) builds, in one private directory on /dev/shm:

    single  loopS  a loop device over a sparse file (single-device scenarios)
    upper   loopU  (direct-io, ext4 mounted) over a file on ext4 on
    lower   loopL  a loop device over a file: the stacked pair of the NVMe incident

and the journal scenario adds its own devices. Everything it creates lives under that directory
(backing files and mountpoints), every sysfs write is journaled, and on exit (success, failure,
Ctrl-C, SIGTERM) it restores the settings, unmounts, detaches and removes the directory; a final
sweep catches anything an interrupt left half-made. Signals are deferred while it cleans up.

Each scenario returns `Check`s: what was expected (page / no page / alert at the ticket
receiver), what the stack did (notifications at the receiver since the onset, alerts pending or
firing in Prometheus), whether they match, and the seconds from onset to the notification.
"""
import contextlib
import dataclasses
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse

from blockstack_deploy import procs
from . import fio, loop

LAB_ROOT = "/dev/shm"  # backing files in memory: fast, and nothing beneath the lower device
DISK_ROOT = "/var/tmp"  # the journal scenario's lower devices: on the root disk, where fsync costs
SINGLE_SIZE = 256 << 20
LOWER_SIZE = 512 << 20
UPPER_SIZE = 192 << 20
PAGE_ALERTS = ("BlockStackMergeCollapse", "BlockStackSnapshotInvalid")
SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The queue settings every scenario starts from (a fresh loop device's defaults).
BASELINE = {"queue/nomerges": "0", "queue/max_sectors_kb": "1280"}


# -- signals ----------------------------------------------------------------------------------

class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so every context manager unwinds."""


def install_signal_handlers():
    """SIGINT and SIGTERM raise (KeyboardInterrupt / Terminated) once; later ones are ignored,
    so a second Ctrl-C cannot break the cleanup the first one started."""
    state = {"raised": False}

    def handler(signum, frame):
        if state["raised"]:
            print(f"\n>> {signal.Signals(signum).name} again: still cleaning up, please wait", flush=True)
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
        self.devices = {}   # role -> /dev/loopN
        self.mounts = {}    # role -> mountpoint
        self.changed = []   # [(dev, attr, value before)] of the settings changed now, in order
        self._es = None

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="blockstack-lab-", dir=self.root)
        self._save()
        self._es = CleanupStack()
        self._es.callback(self.sweep)
        try:
            es = self._es
            self.devices["single"] = es.enter_context(loop.attached(SINGLE_SIZE, directory=self.dir))
            lower = es.enter_context(loop.attached(LOWER_SIZE, directory=self.dir))
            self.devices["lower"] = lower
            lower_mnt = es.enter_context(loop.ext4(lower, loop.NO_DISCARD, directory=self.dir))
            backing = os.path.join(lower_mnt, "upper.img")
            loop.fill(backing, UPPER_SIZE)
            upper = es.enter_context(loop.attached(path=backing, direct_io=True))
            self.devices["upper"] = upper
            self.mounts["upper"] = es.enter_context(loop.ext4(upper, loop.NO_DISCARD, directory=self.dir))
            for role in ("single", "lower", "upper"):
                self.baseline(role)
        except BaseException:
            self._es.close()
            raise
        self.say(f"lab: {self.name('upper')} (direct-io, ext4 on {self.mounts['upper']}) on a file on ext4 on "
                 f"{self.name('lower')}; {self.name('single')} alone; all backed by {self.dir}")
        return self

    def __exit__(self, *exc):
        self.say("lab: cleaning up (restoring settings, unmounting, detaching)")
        return self._es.__exit__(*exc)

    def _save(self):
        """What `sweep_stale` needs to undo this lab if its process is killed (SIGKILL cannot be
        caught): the owner's pid, the disk directory, the settings changed and their old values."""
        with open(os.path.join(self.dir, "lab.json.tmp"), "w") as f:
            json.dump({"pid": os.getpid(), "disk_dir": self.disk_dir,
                       "changed": [list(c) for c in self.changed]}, f)
        os.replace(os.path.join(self.dir, "lab.json.tmp"), os.path.join(self.dir, "lab.json"))

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
        entry = (dev, attr, old)
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
    def journal_fs(self, role, journal_mib, mount_options=""):
        """A stacked pair on the root disk for one scenario: ROLE (direct-io, ext4 with a
        journal_mib MiB journal, mounted) over a file on ext4 on ROLE-lower, a loop device over a
        sparse file in /var/tmp. An fsync on ROLE reaches the disk, so a journal that is too small
        makes its writers wait for checkpoints. Yields the mountpoint."""
        if self.disk_dir is None:
            self.disk_dir = tempfile.mkdtemp(prefix="blockstack-lab-", dir=DISK_ROOT)
            self._save()
        with CleanupStack() as es:
            lower = es.enter_context(loop.attached(JOURNAL_LOWER_SIZE, directory=self.disk_dir))
            self.devices[f"{role}-lower"] = lower
            lower_mnt = es.enter_context(loop.ext4(lower, loop.NO_DISCARD, directory=self.dir))
            backing = os.path.join(lower_mnt, f"{role}.img")
            with open(backing, "w") as f:
                f.truncate(JOURNAL_UPPER_SIZE)
            dev = es.enter_context(loop.attached(path=backing, direct_io=True))
            self.devices[role] = dev
            mnt = es.enter_context(loop.ext4(dev, [*loop.NO_DISCARD, "-J", f"size={journal_mib}"], mount_options,
                                             directory=self.dir))
            self.mounts[role] = mnt
            for r in (f"{role}-lower", role):
                es.enter_context(self._baseline_cm(r))
            try:
                yield mnt
            finally:
                self.mounts.pop(role, None)

    def sweep(self):
        """Undo whatever the context managers could not: settings journaled as changed, mounts
        under the lab directory, loop devices over its files; then remove the directory."""
        for dev, attr, old in reversed(self.changed):  # the last change first: the first's old value wins
            with contextlib.suppress(OSError):
                loop.write_sysfs(dev, attr, old)
                self.say(f"sweep: restored {loop.name(dev)} {attr} -> {old}")
        self.changed.clear()
        if not self.dir:
            return
        dirs = [d + "/" for d in (self.dir, self.disk_dir) if d]
        # which loop devices are ours, read before unmounting: a lazily unmounted filesystem's
        # files show as "/upper.img" in losetup afterwards
        ours = [(dev, back) for dev, back in loop.attached_devices().items() if back.startswith(tuple(dirs))]
        mounts = lab_mounts(self.dir)
        for mnt in sorted(mounts, key=len, reverse=True):
            self.say(f"sweep: unmounting {mnt}")
            subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=60)
        # devices over files inside the lab's filesystems first (the uppers), then the lowers
        inner = tuple(m + "/" for m in mounts)
        for dev, back in sorted(ours, key=lambda kv: not kv[1].startswith(inner) if inner else True):
            self.say(f"sweep: detaching {dev}")
            with contextlib.suppress(subprocess.SubprocessError):
                loop.detach(dev)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def fio_tag(pid):
    return f"blockstack-lab-{pid}"


def fio_of(pid):
    """Pids of the fio processes a lab process `pid` started (named fio_tag(pid)-...)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"fio" and any(
                a.startswith(f"--name={fio_tag(pid)}-".encode()) for a in argv):
            found.append(int(entry))
    return found


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
            with open(os.path.join(d, "lab.json")) as f:
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
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mnt = line.split()[4].encode().decode("unicode_escape")
            if mnt.startswith(directory.rstrip("/") + "/"):
                found.append(mnt)
    return found


# -- what the stack sees ----------------------------------------------------------------------

def _parse_time(s):
    """Alertmanager's RFC 3339 timestamps (nanoseconds, Z or an offset) -> Unix seconds."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", s)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {s}")
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    t = datetime.datetime.fromisoformat(m.group(1) + tz).timestamp()
    return t + (float("0." + m.group(2)) if m.group(2) else 0.0)


@dataclasses.dataclass
class Notified:
    received_at: float
    path: str          # /page or /ticket
    status: str        # firing or resolved
    alertname: str
    device: str
    starts_at: float
    labels: dict
    annotations: dict


class StackView:
    """Prometheus's API and the page receiver's file of one running stack."""

    def __init__(self, prometheus_url, pages_file, host=None, alertmanager_url=None):
        self.prometheus_url, self.pages_file = prometheus_url.rstrip("/"), pages_file
        self.alertmanager_url = alertmanager_url.rstrip("/") if alertmanager_url else None
        self.host = host or socket.gethostname()

    @classmethod
    def from_state(cls, state):
        """The stack `make up` runs in STATE (ports in STATE/ports.json)."""
        with open(os.path.join(state, "ports.json")) as f:
            ports = json.load(f)
        return cls(f"http://127.0.0.1:{ports['prometheus']}", os.path.join(state, "config", "pages.jsonl"),
                   alertmanager_url=f"http://127.0.0.1:{ports['alertmanager']}")

    @classmethod
    def from_stack(cls, stack):
        """A blockstack_lab.stack.Stack started with .running()."""
        am = stack.url("alertmanager") if "alertmanager" in stack.components else None
        return cls(stack.url("prometheus"), stack.pages_file, stack.host, am)

    def query(self, promql):
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = json.loads(procs.http_get(url, timeout=20))
        if body.get("status") != "success":
            raise RuntimeError(f"{promql}: {body}")
        return body["data"]["result"]

    def wait_targets_up(self, timeout=90):
        def up():
            body = json.loads(procs.http_get(f"{self.prometheus_url}/api/v1/targets", timeout=10))
            targets = body["data"]["activeTargets"]
            return targets and all(t["health"] == "up" for t in targets)
        procs.wait_until("every scrape target up", up, timeout)

    def notifications(self, since=0.0):
        """Every alert in every notification received at or after `since`, oldest first."""
        if not os.path.exists(self.pages_file):
            return []
        out = []
        with open(self.pages_file) as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                if rec.get("received_at", 0) < since:
                    continue
                for a in rec["notification"].get("alerts", []):
                    labels = a.get("labels", {})
                    out.append(Notified(rec.get("received_at", 0), rec.get("path", ""), a.get("status", ""),
                                        labels.get("alertname", ""), labels.get("device", ""),
                                        _parse_time(a["startsAt"]) if a.get("startsAt") else 0.0,
                                        labels, a.get("annotations", {})))
        return out

    def alerts(self, devices, with_severity=False):
        """[(alertname, device, state[, severity])] pending or firing in Prometheus on these devices."""
        regex = "|".join(devices)
        res = self.query(f'ALERTS{{alertstate=~"pending|firing",device=~"{regex}"}}')
        keys = ("alertname", "device", "alertstate") + (("severity",) if with_severity else ())
        return sorted({tuple(r["metric"].get(k, "") for k in keys) for r in res})

    def suppressed(self):
        """{(alertname, device)} Alertmanager holds back (inhibited or silenced)."""
        if not self.alertmanager_url:
            return set()
        alerts = json.loads(procs.http_get(f"{self.alertmanager_url}/api/v2/alerts", timeout=20))
        return {(a["labels"].get("alertname", ""), a["labels"].get("device", "")) for a in alerts
                if a.get("status", {}).get("state") == "suppressed"}

    def lineup(self, devices):
        """{device: {operation: (requests/s, sectors per request)}} from the recording rules."""
        regex = "|".join(devices)
        out = {}
        rates = self.query(f'host_device_operation:node_disk_completed:rate{{device=~"{regex}"}}')
        sizes = self.query(f'host_device_operation:node_disk_request_size_sectors:avg{{device=~"{regex}"}}')
        size = {(r["metric"]["device"], r["metric"]["operation"]): float(r["value"][1]) for r in sizes}
        for r in rates:
            dev, op, rate = r["metric"]["device"], r["metric"]["operation"], float(r["value"][1])
            if rate >= 0.5:
                out.setdefault(dev, {})[op] = (rate, size.get((dev, op), float("nan")))
        return out

    def jbd2_wait(self, device):
        res = self.query(f'host_device:ebpf_jbd2_credit_wait_seconds:avg{{device="{device}"}}')
        return float(res[0]["value"][1]) if res else None


class Diskstats:
    """iostat's view from /proc/diskstats when no stack is attached: r/s, w/s and sectors per
    request between two calls."""

    def __init__(self):
        self.last = (time.monotonic(), self._read())

    @staticmethod
    def _read():
        stats = {}
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                # fields: reads completed (3), sectors read (5), writes completed (7), sectors written (9)
                stats[p[2]] = (int(p[3]), int(p[5]), int(p[7]), int(p[9]))
        return stats

    def lineup(self, devices):
        now, stats = time.monotonic(), self._read()
        t0, old = self.last
        self.last = (now, stats)
        dt = max(now - t0, 1e-3)
        out = {}
        for dev in devices:
            if dev not in stats or dev not in old:
                continue
            r, rs, w, ws = (a - b for a, b in zip(stats[dev], old[dev]))
            for op, n, sectors in (("read", r, rs), ("write", w, ws)):
                if n / dt >= 0.5:
                    out.setdefault(dev, {})[op] = (n / dt, sectors / n)
        return out


# -- scenarios --------------------------------------------------------------------------------

@dataclasses.dataclass
class Expect:
    kind: str                 # "page", "alert" (warning at the ticket receiver) or "none"
    alertname: str = ""
    role: str = ""            # the lab device the alert must name
    nothing: str = "no page"  # how to say "none"

    def describe(self, lab):
        if self.kind == "none":
            return self.nothing
        return f"{self.kind} {self.alertname} on {lab.name(self.role)}"


@dataclasses.dataclass
class Check:
    scenario: str
    phase: str
    expected: str
    observed: str
    correct: bool
    seconds: float = None     # onset to notification at the receiver
    resolved_seconds: float = None


@dataclasses.dataclass
class Timing:
    """How long phases last. Defaults suit the 5 s scrape of `make up` (alerts/README.md "Time to
    page": <= 55 s onset to page)."""
    warmup: float = 25        # healthy load before a fault: the 20 s rate windows fill
    quiet: float = 75         # a must-not-page phase: longer than the worst-case time to page
    page_timeout: float = 90  # a page later than this is a miss
    resolve_timeout: float = 120
    alert_timeout: float = 300  # the jbd2 warning: rate window + for + the ticket route's group_wait 30 s
    journal_quiet: float = 180  # the large journal: as long as the warning would need, and more
    settle_timeout: float = 240
    linger: float = 10        # after a page, how long other notifications may still arrive
    narrate_every: float = 15
    corpus_warmup: float = 15  # corpus (corpus.py): healthy load before a sick case's fault
    corpus_quiet: float = 55   # corpus: a healthy case; longer than the worst-case 40 s to page


class Runner:
    """Runs scenarios on a lab against a stack (or none: narration from /proc/diskstats only)."""

    def __init__(self, lab, view=None, timing=None, say=print, tag=None):
        self.lab, self.view, self.t = lab, view, timing or Timing()
        # every fio is named TAG-WORKLOAD: `sweep_stale` finds a killed lab's fio by it
        self.say, self.tag = say, tag or fio_tag(os.getpid())
        self.diskstats = Diskstats()

    # narration

    def narrate(self, roles, onset=None):
        names = self.lab.names()
        devices = [names[r] for r in roles if r in names]
        label = {v: k for k, v in names.items()}
        when = f"+{time.time() - onset:.0f}s " if onset else ""
        if self.view is None:
            lineup, source = self.diskstats.lineup(devices), "iostat"
        else:
            lineup, source = self.view.lineup(devices), "Prometheus"
        parts = []
        for dev in devices:
            ops = lineup.get(dev, {})
            figures = ", ".join(f"{op} {rate:.0f}/s x {size:.1f} sectors" for op, (rate, size) in sorted(ops.items()))
            parts.append(f"{dev} ({label[dev]}): {figures or 'idle'}")
        self.say(f"{when}lineup ({source}): " + "; ".join(parts))
        if self.view is not None:
            alerts = self.view.alerts(devices)
            self.say(f"{when}alerts: " + (", ".join(f"{a} on {d} {s}" for a, d, s in alerts) if alerts else "none pending or firing"))

    def watch(self, seconds, roles, onset=None, until=None):
        """Narrate every narrate_every seconds for `seconds`, or until `until()` is truthy."""
        deadline = time.monotonic() + seconds
        next_say = time.monotonic() + min(self.t.narrate_every, seconds)
        while time.monotonic() < deadline:
            if until is not None:
                value = until()
                if value:
                    return value
            if time.monotonic() >= next_say:
                self.narrate(roles, onset)
                next_say += self.t.narrate_every
            time.sleep(1)
        return until() if until is not None else None

    def fio(self, args, name):
        return fio.background(args, name=f"{self.tag}-{name}")

    # observation

    def _new_firing(self, onset, devices):
        return [n for n in self.view.notifications(onset) if n.status == "firing" and n.device in devices
                and n.starts_at >= onset - 1]

    def settle(self):
        """Wait until no alert is pending or firing on a lab device (the previous scenario's
        resolve), bounded."""
        if self.view is None:
            return
        devices = list(self.lab.names().values())
        try:
            procs.wait_until("the lab's alerts to clear", lambda: not self.view.alerts(devices),
                             self.t.settle_timeout, interval=2)
        except TimeoutError:
            self.say(f"still active after {self.t.settle_timeout:.0f} s: {self.view.alerts(devices)}")

    def observe(self, scenario, phase, expect, onset, roles):
        """Watch a phase that began at `onset` (Unix time) and judge it against `expect`."""
        lab = self.lab
        expected = expect.describe(lab)
        if self.view is None:
            self.watch(self.t.quiet if expect.kind == "none" else self.t.page_timeout, roles, onset)
            return Check(scenario, phase, expected, "not observed (no stack)", True)
        devices = set(lab.names().values())
        seconds = None
        if expect.kind == "none":
            self.watch(self.t.quiet, roles, onset)
        else:
            path = "/page" if expect.kind == "page" else "/ticket"
            target = lab.name(expect.role)
            timeout = self.t.page_timeout if expect.kind == "page" else self.t.alert_timeout

            def arrived():
                return [n for n in self._new_firing(onset, devices)
                        if n.path == path and n.alertname == expect.alertname and n.device == target]
            hit = self.watch(timeout, roles, onset, until=arrived)
            if hit:
                seconds = hit[0].received_at - onset
                self.say(f"+{seconds:.0f}s {'PAGE' if path == '/page' else 'TICKET'} at the receiver ({path}): "
                         f"{hit[0].alertname} on {hit[0].device}: {hit[0].annotations.get('summary', '')}")
                for key in ("likely_cause", "description"):
                    if hit[0].annotations.get(key):
                        self.say(f"    {key}: {' '.join(hit[0].annotations[key].split())}")
                time.sleep(self.t.linger)
        got = self._new_firing(onset, devices)
        # what reached the receiver: the verdict
        seen = {(n.alertname, n.device, "page" if n.path == "/page" else "alert") for n in got}
        # what Prometheus has that did not: a pending or firing page, or a firing warning, that
        # Alertmanager does not hold back would arrive shortly, so it counts; inhibited alerts and
        # warnings still inside their `for:` (minutes) are reported but do not
        suppressed = self.view.suppressed()
        extra, late = [], set()
        for a, d, state, severity in self.view.alerts(devices, with_severity=True):
            if any(x[0] == a and x[1] == d for x in seen):
                continue
            if severity == "critical" and (a, d) not in suppressed:
                late.add((a, d, f"{state} page in Prometheus"))
            elif state == "firing" and (a, d) not in suppressed:
                late.add((a, d, f"firing {severity} in Prometheus"))
            else:
                why = "inhibited" if (a, d) in suppressed else f"{severity} {state}, not at the receiver"
                extra.append(f"{a} on {d} ({why})")
        seen |= late
        observed = ", ".join(f"{kind} {a} on {d}" for a, d, kind in sorted(seen)) or expect.nothing
        if extra:
            observed += "; also " + ", ".join(sorted(extra))
        if expect.kind == "none":
            correct = not seen
        else:
            want = ("page" if expect.kind == "page" else "alert")
            correct = seconds is not None and {(a, d, k) for a, d, k in seen} == {(expect.alertname, lab.name(expect.role), want)}
        self.say(f"{scenario} / {phase}: expected {expected}; observed {observed}"
                 + (f" after {seconds:.0f} s" if seconds is not None else "") + (" - OK" if correct else " - WRONG"))
        return Check(scenario, phase, expected, observed, correct, seconds)

    def resolved(self, check, expect, since):
        """After a fault is undone: seconds until the receiver got the resolve, bounded."""
        if self.view is None or check.seconds is None:
            return
        target = self.lab.name(expect.role)

        def resolve():
            return [n for n in self.view.notifications(since) if n.status == "resolved"
                    and n.alertname == expect.alertname and n.device == target]
        hit = self.watch(self.t.resolve_timeout, ["single", "upper", "lower"], since, until=resolve)
        if hit:
            check.resolved_seconds = hit[0].received_at - since
            self.say(f"+{check.resolved_seconds:.0f}s resolved at the receiver: {expect.alertname} on {target}")
        else:
            self.say(f"no resolve within {self.t.resolve_timeout:.0f} s")


def _seq_read(dev):
    return [*fio.SEQ_BATCHED_READ, f"--filename={dev}", "--readonly"]


def merge_collapse_nomerges(r):
    """Sequential batched 4 KiB direct reads on the single device; nomerges 0 -> 2 -> 0.
    Expected: the collapse page on that device, merging refused (eBPF; diskstats alone cannot tell
    it from random 4 KiB I/O), resolved after nomerges goes back to 0."""
    lab, roles, expect = r.lab, ["single"], Expect("page", "BlockStackMergeCollapse", "single")
    with r.fio(_seq_read(lab.devices["single"]), "seq"):
        r.say(f"healthy: nomerges=0, batched sequential reads on {lab.name('single')} for {r.t.warmup:.0f} s")
        r.watch(r.t.warmup, roles)
        with lab.setting("single", "queue/nomerges", "2"):
            onset = time.time()
            check = r.observe("merge-collapse-nomerges", "nomerges=2", expect, onset, roles)
        back = time.time()
        r.resolved(check, expect, back)
    return [check]


def stack_split(r):
    """Sequential batched reads on the upper of the stacked pair; the lower's max_sectors_kb
    1280 -> 4 -> back. Expected: the layered collapse page naming the lower device."""
    lab, roles, expect = r.lab, ["upper", "lower"], Expect("page", "BlockStackMergeCollapse", "lower")
    with r.fio(_seq_read(lab.devices["upper"]), "seq"):
        r.say(f"healthy: batched sequential reads on {lab.name('upper')} for {r.t.warmup:.0f} s")
        r.watch(r.t.warmup, roles)
        with lab.setting("lower", "queue/max_sectors_kb", "4"):
            onset = time.time()
            check = r.observe("stack-split", "lower max_sectors_kb=4", expect, onset, roles)
        back = time.time()
        r.resolved(check, expect, back)
    return [check]


def random_4k(r):
    """Random 4 KiB direct reads and writes (8 sectors per request by nature) on the single device
    and on a file in the ext4 on the stacked pair. Must not page."""
    lab, roles = r.lab, ["single", "upper", "lower"]
    rw = ["--rw=randrw", "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=16"]
    with r.fio([*rw, f"--filename={lab.devices['single']}"], "rand-dev"), \
            r.fio([*rw, f"--directory={lab.mounts['upper']}", "--size=64m"], "rand-file"):
        onset = time.time()
        r.say(f"random 4 KiB reads and writes on {lab.name('single')} and in the ext4 on {lab.name('upper')}")
        return [r.observe("random-4k", "randrw 4k", Expect("none"), onset, roles)]


def nomerges_1(r):
    """nomerges=1 (simple one-hit merges only) on the single device and on the stacked pair's
    lower, under batched sequential reads. Merging still happens. Must not page."""
    lab, roles = r.lab, ["single", "upper", "lower"]
    with lab.setting("single", "queue/nomerges", "1"), lab.setting("lower", "queue/nomerges", "1"), \
            r.fio(_seq_read(lab.devices["single"]), "seq-single"), r.fio(_seq_read(lab.devices["upper"]), "seq-upper"):
        onset = time.time()
        return [r.observe("nomerges-1", "nomerges=1", Expect("none"), onset, roles)]


def trickle(r):
    """A few small I/Os per second (5 random 4 KiB reads and 5 writes) on the single device and in
    the ext4. Small requests, but far too few to matter. Must not page."""
    lab, roles = r.lab, ["single", "upper", "lower"]
    rw = ["--rw=randrw", "--bs=4k", "--direct=1", "--ioengine=psync", "--rate_iops=5,5"]
    with r.fio([*rw, f"--filename={lab.devices['single']}"], "trickle-dev"), \
            r.fio([*rw, f"--directory={lab.mounts['upper']}", "--size=16m"], "trickle-file"):
        onset = time.time()
        return [r.observe("trickle", "5+5 IOPS", Expect("none"), onset, roles)]


# The ext4 incident's workload: many tasks doing 16 KiB random buffered writes, each followed by
# fdatasync, on a filesystem mounted data=journal (every write goes through the journal, so a
# small journal fills quickly) whose journal is too small for them. Measured here (2 cores, the
# stacked pair on the root disk, 20 s): 4 MiB journal, 64 writers 0.14-0.17 ms average credit
# wait (1.9 ms on a busy machine), 128 writers 0.67 ms (p99 <= 16 ms); 1 GiB journal 0.03-0.05 ms
# (p99 <= 2 ms) with either. 128 writers keep the small journal well above the alert's 0.5 ms.
JOURNAL_WRITERS = 128
JOURNAL_FIO = ["--rw=randwrite", "--bs=16k", "--ioengine=psync", "--fdatasync=1", "--buffered=1",
               f"--numjobs={JOURNAL_WRITERS}", "--size=4m", "--group_reporting"]
JOURNAL_LOWER_SIZE = 4 << 30         # sparse files: room for a 1 GiB journal and the writers' files
JOURNAL_UPPER_SIZE = 3 << 30
JOURNAL_PHASES = (
    # (phase, role, journal MiB, mount options, expectation)
    ("4 MiB journal", "jsmall", 4, "data=journal", Expect("alert", "BlockStackJbd2CreditWaitHigh", "jsmall")),
    ("1 GiB journal", "jlarge", 1024, "data=journal", Expect("none", nothing="no alert")),
)


def journal_starvation(r):
    """fsync-heavy random buffered writes (16 KiB, fdatasync) from 128 jobs on an ext4 with a 4 MiB
    journal, then on one with a 1 GiB journal (the ext4 incident's third fix), each mounted
    data=journal on a stacked pair on the root disk. Expected: the jbd2 credit-wait warning
    (ticket) on the first only."""
    checks = []
    for phase, role, journal_mib, options, expect in JOURNAL_PHASES:
        with r.lab.journal_fs(role, journal_mib, options) as mnt:
            r.say(f"{phase}: {JOURNAL_WRITERS} writers, 16 KiB randwrite + fdatasync, on {r.lab.name(role)} ({options})")
            with r.fio([*JOURNAL_FIO, f"--directory={mnt}"], role):
                onset = time.time()
                saved, r.t.quiet = r.t.quiet, r.t.journal_quiet
                try:
                    check = r.observe("journal-starvation", phase, expect, onset, [role, f"{role}-lower"])
                finally:
                    r.t.quiet = saved
                if r.view is not None:
                    wait = r.view.jbd2_wait(r.lab.name(role))
                    if wait is not None:
                        check.observed += f" (credit wait {wait * 1e3:.2f} ms avg)"
                        r.say(f"{phase}: average credit wait {wait * 1e3:.3f} ms")
                checks.append(check)
        r.settle()
    return checks


SCENARIOS = {
    "merge-collapse-nomerges": merge_collapse_nomerges,
    "stack-split": stack_split,
    "random-4k": random_4k,
    "nomerges-1": nomerges_1,
    "trickle": trickle,
    "journal-starvation": journal_starvation,
}


def describe(name):
    return " ".join(SCENARIOS[name].__doc__.split())


def run(runner, names):
    """Run scenarios in order on one lab; returns every Check."""
    checks = []
    for name in names:
        runner.say(f"== {name}: {describe(name)}")
        runner.settle()
        checks += SCENARIOS[name](runner)
    return checks


def table(checks):
    """The detection table, Markdown."""
    rows = ["| scenario | phase | expected | observed | onset to notification | resolved after | correct |",
            "|---|---|---|---|---|---|---|"]
    for c in checks:
        secs = f"{c.seconds:.0f} s" if c.seconds is not None else "-"
        res = f"{c.resolved_seconds:.0f} s" if c.resolved_seconds is not None else "-"
        rows.append(f"| {c.scenario} | {c.phase} | {c.expected} | {c.observed} | {secs} | {res} | {'yes' if c.correct else 'NO'} |")
    return "\n".join(rows)
