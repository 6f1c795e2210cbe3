"""The dm collector's side of --collector.dm.helper SOCKET: the exporter holds no capability and
asks the helper (dm_helper.py, the only holder of CAP_SYS_ADMIN, which the DM ioctls need) for
one of the two listings by name ("table" or "status"), which the helper runs dmsetup for with
exactly the arguments of REQUESTS, or for its device-mapper event token ("events": the
exporter cannot open /dev/mapper/control, the helper can)."""

import socket
import time

from .dmsetup import (
    EVENTS,
    MAX_OUTPUT_BYTES,
    MAX_STDERR_BYTES,
    REASONS,
    REQUESTS,
    DmsetupError,
    Started,
    bounded,
    named,
    stderr_line,
)


class HelperClient:
    """Runs a dmsetup listing through the helper on a Unix socket, as Dmsetup.run would (or
    starts it, as Dmsetup.start would, and reads it later), and reads its event token, as
    Dmsetup.events would."""

    def __init__(self, helper, timeout=5.0):
        self.helper, self.timeout = helper, timeout

    def run(self, args, timeout=None):
        """dmsetup's output, as the helper answers the request naming args."""
        return self.finish(self.start(args, timeout))

    def start(self, args, timeout=None):
        """The request naming args sent, its answer not waited for: for finish() or stop()."""
        word = next(w for w, a in REQUESTS.items() if a == tuple(args))
        return self._send(word, named(args), timeout)

    def events(self, timeout=None):
        """The helper's ControlEvents token (None: it has none): when it changes, a table may
        have."""
        run = self._send(EVENTS, "the dm helper's event token", timeout)
        return self.finish(run).strip() or None

    def _send(self, word, command, timeout):
        """A connection to the helper with one request sent. Helper down or refusing:
        DmsetupError."""
        timeout = bounded(command, self.timeout, timeout)
        started = time.monotonic()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(timeout)
            s.connect(self.helper)
            s.sendall(word.encode() + b"\n")
        except OSError as e:
            s.close()
            raise self._failure(command, e, timeout) from None
        except BaseException:
            s.close()
            raise
        return Started(command, s, started, started + timeout)

    def finish(self, run, timeout=None):
        """The helper's answer to a sent request: "ok\n" and the text, or "error REASON\n" and
        its message (dm_helper.py); waited for until the request's deadline or, sooner,
        `timeout` seconds from now. Mute or failing helper: DmsetupError."""
        deadline = run.until(timeout)
        reply = bytearray()
        try:
            with run.handle as s:
                while True:
                    s.settimeout(max(deadline - time.monotonic(), 0.001))
                    chunk = s.recv(1 << 16)
                    if not chunk:
                        break
                    reply += chunk
                    if len(reply) > MAX_OUTPUT_BYTES + MAX_STDERR_BYTES:
                        raise DmsetupError(
                            f"{run.command}: the helper wrote more than {MAX_OUTPUT_BYTES} bytes",
                            "too_large",
                        )
        except OSError as e:
            raise self._failure(run.command, e, deadline - run.started) from None
        head, _, body = bytes(reply).partition(b"\n")
        if head == b"ok":
            return body.decode("utf-8", "replace")
        if not head.startswith(b"error "):
            raise DmsetupError(
                f"{run.command}: unexpected answer from the dm helper ({len(reply)} bytes)"
            )
        reason = head.removeprefix(b"error ").decode("ascii", "replace")
        raise DmsetupError(
            stderr_line(body) or f"{run.command} failed in the dm helper",
            reason if reason in REASONS else "command",
        )

    @staticmethod
    def stop(run):
        """A sent request given up unread: the connection closed (the helper finishes its
        dmsetup and finds no one to answer). Nothing once finish() has read it."""
        run.handle.close()

    def _failure(self, command, e, timeout):
        if isinstance(e, TimeoutError):
            return DmsetupError(
                f"{command}: no answer from the dm helper {self.helper} in {timeout:.2g}s",
                "timeout",
            )
        return DmsetupError(f"{command}: dm helper {self.helper}: {e.strerror or e}")
