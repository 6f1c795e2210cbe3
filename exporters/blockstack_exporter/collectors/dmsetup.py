"""Running `dmsetup`, bounded: in its own session, killed (with whatever it started) when it
runs out of time, its output capped. `--noflush` keeps the status call from committing
thin-pool metadata on every scrape (dm-thin.c pool_status commits unless DM_STATUS_NOFLUSH_FLAG
is set); the numbers are at most one commit period old. `lvs` is never run: it takes LVM's locks
and scans every PV, and a scrape must not."""

import logging
import os
import selectors
import signal
import subprocess
import time

from ..fs import TooLarge

log = logging.getLogger("blockstack_exporter")

TABLE_ARGS = ("table",)
STATUS_ARGS = ("status", "--noflush")
# The whole interface of the privileged helper (dm_helper.py): a request names one of these.
REQUESTS = {"table": TABLE_ARGS, "status": STATUS_ARGS}
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


def bounded(args, limit, timeout):
    """(the command as messages name it, the seconds it may take: the flag's limit, or less: the
    collector's deadline); DmsetupError when the deadline has passed."""
    timeout = limit if timeout is None else min(limit, timeout)
    command = f"`dmsetup {' '.join(args)}`"
    if timeout <= 0:
        raise DmsetupError(f"{command} not run: the collector's deadline has passed", "deadline")
    return command, timeout


def stderr_line(data):
    """dmsetup's complaint on one line: '/dev/mapper/control: open failed: ...; Command failed.'"""
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return "; ".join(lines)[:300]


class Dmsetup:
    """dmsetup run here (the exporter without --collector.dm.helper, and dm_helper.py)."""

    def __init__(self, dmsetup="dmsetup", timeout=5.0, preexec_fn=None):
        """preexec_fn: run in the dmsetup child before exec (dm_helper.py: its capability)."""
        self.dmsetup, self.timeout, self.preexec_fn = dmsetup, timeout, preexec_fn
        self._abandoned = []  # dmsetup processes that did not die when killed (stuck in an ioctl)

    def run(self, args, timeout=None):
        """stdout of `dmsetup ARGS` as text; DmsetupError if absent, failing, slower than the
        timeout (the flag's, or less: the collector's deadline) or writing more than
        MAX_OUTPUT_BYTES.

        dmsetup runs in its own session so that a timeout kills it and anything it started."""
        self._reap()
        command, timeout = bounded(args, self.timeout, timeout)
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
        try:
            out, err = self._read(proc, time.monotonic() + timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            raise DmsetupError(
                f"{command} timed out after {timeout:.2g}s; killed", "timeout"
            ) from None
        except TooLarge:
            self._kill(proc)
            raise DmsetupError(
                f"{command} wrote more than {MAX_OUTPUT_BYTES} bytes; killed", "too_large"
            ) from None
        if proc.wait() != 0:
            raise DmsetupError(f"{command} exited with {proc.returncode}: {stderr_line(err)}")
        return out.decode("utf-8", "replace")

    @staticmethod
    def _read(proc, deadline):
        """Both pipes to end of file, stdout bounded, stderr kept up to MAX_STDERR_BYTES."""
        out, err = bytearray(), bytearray()
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(proc.args, 0)
                for key, _ in sel.select(left):
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
        left = deadline - time.monotonic()
        try:
            proc.wait(max(left, 0.01))
        except subprocess.TimeoutExpired:
            raise
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
