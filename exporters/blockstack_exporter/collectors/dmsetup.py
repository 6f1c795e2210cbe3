"""Running `dmsetup`, bounded: in its own session, killed (with whatever it started) when it
runs out of time, its output capped. `--noflush` keeps the status call from committing
thin-pool metadata on every scrape (dm-thin.c pool_status commits unless DM_STATUS_NOFLUSH_FLAG
is set); the numbers are at most one commit period old. `lvs` is never run: it takes LVM's locks
and scans every PV, and a scrape must not."""

import logging
import os
import select
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

from ..fs import TooLarge

log = logging.getLogger("blockstack_exporter")

TABLE_ARGS = ("table",)
STATUS_ARGS = ("status", "--noflush")
# The whole interface of the privileged helper (dm_helper.py): a request names one of these, or
# is EVENTS, which runs nothing and answers the helper's ControlEvents token.
REQUESTS = {"table": TABLE_ARGS, "status": STATUS_ARGS}
EVENTS = "events"
DM_CONTROL = "/dev/mapper/control"
REASONS = (
    "command",
    "timeout",
    "too_large",
    "deadline",
)  # the DmsetupError reasons a helper may answer
KILL_GRACE = 1.0  # seconds to reap a killed dmsetup before abandoning it (stuck in an ioctl)
MAX_OUTPUT_BYTES = 8 << 20  # dmsetup's output for ~50k targets; beyond, it is not dmsetup talking
MAX_STDERR_BYTES = 4096


class DmsetupError(Exception):
    """dmsetup could not be run, failed, or timed out."""

    def __init__(self, message, reason="command"):
        super().__init__(message)
        self.reason = reason


@dataclass
class Started:
    """A request begun by start() (Dmsetup's or HelperClient's) and not yet answered: finish()
    reads its answer, stop() ends it unread. Both may be called again (they then do nothing)."""

    command: str  # as messages name it
    handle: object  # the dmsetup process (Dmsetup), the socket to the helper (HelperClient)
    started: float  # monotonic() when it began
    deadline: float  # monotonic() by which it is given up: started + its timeout

    def until(self, timeout=None):
        """The monotonic time to wait for it until: its deadline, or sooner, `timeout` seconds
        from now (the collector's deadline, in its turn)."""
        if timeout is None:
            return self.deadline
        return min(self.deadline, time.monotonic() + timeout)


def named(args):
    """A dmsetup command as messages name it."""
    return f"`dmsetup {' '.join(args)}`"


def bounded(command, limit, timeout):
    """The seconds a command may take: the flag's limit, or less: the collector's deadline;
    DmsetupError when the deadline has passed."""
    timeout = limit if timeout is None else min(limit, timeout)
    if timeout <= 0:
        raise DmsetupError(f"{command} not run: the collector's deadline has passed", "deadline")
    return timeout


def exit_descriptor(proc):
    """A descriptor that polls readable once the process has exited (pidfd_open, Linux 5.3), or
    None. Without it Popen.wait(timeout) polls for the exit, sleeping 1, 2, 4 ms... in between:
    1.4 ms of a dmsetup run's wall time on average (cProfile, 100 devices), after its output."""
    try:
        return os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return None


def stderr_line(data):
    """dmsetup's complaint on one line: '/dev/mapper/control: open failed: ...; Command failed.'"""
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return "; ".join(lines)[:300]


class ControlEvents:
    """Whether device-mapper may have changed a table, read from its control node by poll(2),
    without an ioctl (so without CAP_SYS_ADMIN: ctl_ioctl checks it, dm_poll does not).

    The kernel counts dm_global_event_nr up on every create, remove and rename (the ioctls
    flagged IOCTL_FLAGS_ISSUE_GLOBAL_EVENT in drivers/md/dm-ioctl.c), every table a resume swaps
    in (dm.c dm_swap_table) and every target event (dm.c event_callback). An open file of the
    node notes the count at open() (dm_open) and polls readable once it has moved (dm_poll).
    Re-arming it is the DM_DEV_ARM_POLL ioctl, so the node is opened anew instead. A kernel
    without dm_poll (before 4.14) or a file that is not device-mapper's polls readable always:
    every call is then a change."""

    def __init__(self, path=DM_CONTROL):
        self.path = path
        self._fd = None
        self._poll = select.poll()  # not select(): the exporter's descriptors go past 1023
        self._token = None

    def token(self):
        """A string that changes whenever device-mapper announced an event since the last call
        (the monotonic time the node was last opened: unique across restarts within a boot);
        None when the node cannot be opened (no device-mapper, no permission)."""
        if self._fd is not None and not self._poll.poll(0):
            return self._token
        self._close()
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            return None
        self._poll.register(self._fd, select.POLLIN)
        self._token = str(time.monotonic_ns())
        return self._token

    def _close(self):
        if self._fd is not None:
            self._poll.unregister(self._fd)
            os.close(self._fd)
            self._fd = None


class Dmsetup:
    """dmsetup run here (the exporter without --collector.dm.helper, and dm_helper.py)."""

    def __init__(self, dmsetup="dmsetup", timeout=5.0, preexec_fn=None, control=DM_CONTROL):
        """preexec_fn: run in the dmsetup child before exec (dm_helper.py: its capability);
        control: device-mapper's control node, watched for its events (ControlEvents)."""
        self.dmsetup, self.timeout, self.preexec_fn = dmsetup, timeout, preexec_fn
        self._events = ControlEvents(control)
        self._abandoned = []  # dmsetup processes that did not die when killed (stuck in an ioctl)

    def events(self, timeout=None):
        """The ControlEvents token of the control node: when it changes, a table may have.
        (No timeout here: a poll(2) that does not wait; HelperClient's asks the helper.)"""
        return self._events.token()

    def run(self, args, timeout=None):
        """stdout of `dmsetup ARGS` as text; DmsetupError if absent, failing, slower than the
        timeout (the flag's, or less: the collector's deadline) or writing more than
        MAX_OUTPUT_BYTES."""
        return self.finish(self.start(args, timeout))

    def start(self, args, timeout=None):
        """`dmsetup ARGS` started and left running, for finish() to read or stop() to end: so
        that the dm collector can start the status at the scrape's start and read it in its
        turn (DmCollector.begin). DmsetupError if it cannot be started or the deadline passed.

        dmsetup runs in its own session so that a timeout kills it and anything it started."""
        self._reap()
        command = named(args)
        timeout = bounded(command, self.timeout, timeout)
        argv = [self.dmsetup, *args]
        env = dict(os.environ, LC_ALL="C")
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=env,
                preexec_fn=self.preexec_fn,
            )
        except OSError as e:
            raise DmsetupError(f"cannot run {self.dmsetup}: {e.strerror or e}") from None
        now = time.monotonic()
        return Started(command, proc, now, now + timeout)

    def finish(self, run, timeout=None):
        """The output of a started dmsetup, as run() returns it and with its errors; waited for
        until its own deadline or, sooner, `timeout` seconds from now (the collector's deadline).
        A dmsetup past it, or writing too much, is killed."""
        proc = run.handle
        deadline = run.until(timeout)
        try:
            out, err = self._read(proc, deadline)
        except subprocess.TimeoutExpired:
            self.stop(run)
            raise DmsetupError(
                f"{run.command} timed out after {deadline - run.started:.2g}s; killed", "timeout"
            ) from None
        except TooLarge:
            self.stop(run)
            raise DmsetupError(
                f"{run.command} wrote more than {MAX_OUTPUT_BYTES} bytes; killed", "too_large"
            ) from None
        except BaseException:  # interrupted: nothing of it may outlive the scrape
            self.stop(run)
            raise
        if proc.wait() != 0:
            raise DmsetupError(f"{run.command} exited with {proc.returncode}: {stderr_line(err)}")
        return out.decode("utf-8", "replace")

    def stop(self, run):
        """A started dmsetup ended unread (its output no longer wanted, or the scrape ended
        before its turn): killed with whatever it started, reaped, its pipes closed. Nothing
        once finish() has read it: it was reaped, and its pid may be another process's now."""
        if run.handle.returncode is None:
            self._kill(run.handle)

    @staticmethod
    def _read(proc, deadline):
        """Both pipes to end of file, stdout bounded, stderr kept up to MAX_STDERR_BYTES, and
        the process's exit."""
        out, err = bytearray(), bytearray()
        exited = exit_descriptor(proc)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ, out)
                sel.register(proc.stderr, selectors.EVENT_READ, err)
                if exited is not None:
                    sel.register(exited, selectors.EVENT_READ, None)
                while sel.get_map():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise subprocess.TimeoutExpired(proc.args, 0)
                    for key, _ in sel.select(left):
                        if key.data is None:
                            sel.unregister(exited)  # it has exited: proc.wait() returns at once
                            continue
                        chunk = os.read(key.fd, 1 << 16)
                        if not chunk:
                            sel.unregister(key.fileobj)
                            key.fileobj.close()
                        elif key.data is out:
                            out += chunk
                            if len(out) > MAX_OUTPUT_BYTES:
                                raise TooLarge("dmsetup output")
                        elif len(err) < MAX_STDERR_BYTES:
                            err += chunk[: MAX_STDERR_BYTES - len(err)]
        finally:
            if exited is not None:
                os.close(exited)
        proc.wait(max(deadline - time.monotonic(), 0.01))
        return bytes(out), bytes(err)

    def _kill(self, proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.communicate(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            # Uninterruptible sleep: the kill lands when the ioctl returns. Do not wait for it.
            for pipe in (proc.stdout, proc.stderr):
                try:
                    if pipe and not pipe.closed:
                        pipe.close()
                except OSError:
                    pass
            self._abandoned.append(proc)
            log.warning(
                "collector dm: dmsetup pid %d did not exit after SIGKILL; abandoned", proc.pid
            )

    def _reap(self):
        self._abandoned = [p for p in self._abandoned if p.poll() is None]
