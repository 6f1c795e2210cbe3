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
    bounded,
    named,
    stderr_line,
)


class HelperClient:
    """Runs a dmsetup listing through the helper on a Unix socket, as Dmsetup.run would, and
    reads its event token, as Dmsetup.events would."""

    def __init__(self, helper, timeout=5.0):
        self.helper, self.timeout = helper, timeout

    def run(self, args, timeout=None):
        """dmsetup's output, as the helper answers the request naming args."""
        word = next(w for w, a in REQUESTS.items() if a == tuple(args))
        return self._ask(word, named(args), timeout)

    def events(self, timeout=None):
        """The helper's ControlEvents token (None: it has none): when it changes, a table may
        have."""
        return self._ask(EVENTS, "the dm helper's event token", timeout).strip() or None

    def _ask(self, word, command, timeout):
        """The helper's answer to one request: "ok\n" and the text, or "error REASON\n" and its
        message (dm_helper.py). Helper down, refused or mute: DmsetupError."""
        timeout = bounded(command, self.timeout, timeout)
        deadline = time.monotonic() + timeout
        reply = bytearray()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(self.helper)
                s.sendall(word.encode() + b"\n")
                while chunk := s.recv(1 << 16):
                    reply += chunk
                    if len(reply) > MAX_OUTPUT_BYTES + MAX_STDERR_BYTES:
                        raise DmsetupError(
                            f"{command}: the helper wrote more than {MAX_OUTPUT_BYTES} bytes",
                            "too_large",
                        )
                    s.settimeout(max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise DmsetupError(
                f"{command}: no answer from the dm helper {self.helper} in {timeout:.2g}s",
                "timeout",
            ) from None
        except OSError as e:
            raise DmsetupError(f"{command}: dm helper {self.helper}: {e.strerror or e}") from None
        head, _, body = bytes(reply).partition(b"\n")
        if head == b"ok":
            return body.decode("utf-8", "replace")
        if not head.startswith(b"error "):
            raise DmsetupError(
                f"{command}: unexpected answer from the dm helper ({len(reply)} bytes)"
            )
        reason = head.removeprefix(b"error ").decode("ascii", "replace")
        raise DmsetupError(
            stderr_line(body) or f"{command} failed in the dm helper",
            reason if reason in REASONS else "command",
        )
