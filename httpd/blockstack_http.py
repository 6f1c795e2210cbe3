"""The connection layer of the project's HTTP servers (blockstack-exporter's /metrics, the metrics
front of node_exporter and ebpf_exporter, the page receiver, the fleet's alert gate): http.server,
with what a server reachable by every local user needs. Standard library only.

Each connection carries one request (HTTP/1.0: the answer ends the connection). What a connection
gets:
- Its request line and headers (and, for a handler that says so, its body) must arrive whole within
  the server's request_seconds, counted from when its thread starts reading: each read waits only
  for what is left of that time (a client trickling a byte a second gains nothing). Past it the
  connection is closed without an answer (one line through the handler's log_message).
- A server with an ssl.SSLContext in `tls` (the alert gate) serves TLS: the socket is wrapped in the
  connection's own thread and the handshake is its first read, so it too must be done within
  request_seconds; the wrapped socket is the one counted, evicted, handled and shut down.
- A request that did not arrive whole (cut off in its request line or headers: the client closed,
  or was closed) reaches no handler method: nothing is collected, forwarded or written for it.
- 400, and the connection closed, for a request line that is not `METHOD TARGET HTTP/1.x` (so no
  HTTP/0.9: a line without a version gets a 400 with headers, never a bare body), for a target with
  anything but visible ASCII (control characters, spaces, bytes above 0x7e), and for a header line
  that is not `name: value` (a name of token characters, a value without control characters but
  tab; no folded lines). 431 past MAX_HEADERS header lines or a header line longer than
  MAX_LINE, 414 for a request line over 64 KiB (http.server's bound).
- At most max_connections connections are served at once, each a thread. At that number a new
  connection is taken, not left in the backlog: the connection that has been sending its request
  the longest (an incomplete one; a request that arrived whole is never closed for another) is
  closed to make room. Only when every connection has its whole request in hand is the new one
  closed at once. The accept loop never waits.
- The listen backlog is socket.SOMAXCONN (4096; net.core.somaxconn caps it): a burst of connects
  waits in the kernel instead of being refused or dropped until a SYN retry.
- The soft RLIMIT_NOFILE is raised to the hard one (a connection is a descriptor).
- Handler.client_gone() tells a handler, before costly work (a collection, a forward), whether its
  client has already closed (a client that only shut down its sending side looks the same).
- Errors of a client's connection (reset, broken pipe, a write that timed out) are one log line,
  never a traceback; anything else is a bug and keeps its traceback.

What a handler gets for its answer and a request's body (Handler.reply, Handler.read_body):
- reply(): the status line, Content-Type, Content-Length, the handler's own headers and the body
  (none to a HEAD), written within reply_seconds; the connection ends after it.
- read_body(): the body whole, or Refused with the answer's status: 415 for another Content-Type
  than the one asked, 411 without Content-Length, 400 for one that is not decimal digits (a
  negative one too), 413 past the handler's max_body, 408 when the body did not arrive within the
  request's time, 400 when the client ended it short of its Content-Length. A body refused for
  its type or size is read and dropped first (drain()), so that the client reads the answer, not
  a reset.
"""

import contextlib
import http.client
import io
import logging
import os
import re
import resource
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("blockstack_http")

REQUEST_SECONDS = (
    5.0  # a local client (Prometheus, Alertmanager, curl) sends its request in milliseconds
)
MAX_CONNECTIONS = 1024  # a waiting connection is a thread with little memory of its own
REPLY_SECONDS = (
    30.0  # a socket write of the answer may wait this long (a client that stops reading)
)
MAX_BODY = 1 << 20  # bytes of a request body read_body takes (a handler's max_body)
CHUNK = 1 << 16  # a body is read this much at a time: memory follows what arrived, not its header
# A refused request's body read and dropped at most (as the gate drained before): beyond it the
# connection is closed, and the client may see a reset instead of the answer.
DRAIN_MAX = 8 << 20
TEXT = "text/plain; charset=utf-8"  # the content type of a reply unless told
MAX_LINE = 8192  # bytes of one header line (Prometheus and Alertmanager send a few hundred)
MAX_HEADERS = 100  # http.client's own limit

# RFC 9112 3: request-line = method SP request-target SP HTTP-version; the target of visible ASCII
# only (RFC 3986: other bytes are percent-encoded), so a control character never reaches a handler.
REQUEST_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}) ([\x21-\x7e]+) (HTTP/1\.[01])\r?\n")
# RFC 9110 5: field-name = token; field-value of visible characters, SP, HTAB and obs-text.
HEADER_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*\r?\n")


def raise_descriptor_limit():
    """Soft RLIMIT_NOFILE up to the hard one: a connection is a descriptor, and the default soft
    limit of 1,024 is reached before max_connections (accept then fails and the loop spins)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # the kernel's nr_open default
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        pass  # the limit stays: connections past it are refused by accept


def unix_listener(path, backlog):
    """A listening Unix stream socket at path (one left by an earlier run is replaced). Anyone may
    connect to the socket itself: who reaches it is the business of its directory's mode and group
    (0750, the one client's group), which the caller sets."""
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o666)
    sock.listen(backlog)
    return sock


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each recv given only what is left of the request's time."""

    def __init__(self, sock, deadline):
        self.sock, self.deadline = sock, deadline

    def readable(self):
        return True

    def readinto(self, buf):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not received in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buf)


class Refused(Exception):
    """A request body not taken (Handler.read_body): the status and the reason to answer with."""

    def __init__(self, status, reason):
        super().__init__(status, reason)
        self.status, self.reason = status, reason


class Handler(BaseHTTPRequestHandler):
    """One request per connection, checked as the module says. A subclass defines do_GET etc. as
    with http.server; a handler that reads a body for a method in body_methods calls arrived() once
    the body is in (until then its connection may be closed to make room, and its body must arrive
    within the request time too): read_body() does both."""

    protocol_version = "HTTP/1.0"
    body_methods = ()
    reply_seconds = REPLY_SECONDS
    max_body = MAX_BODY

    def setup(self):
        super().setup()
        self.rfile.close()
        self.rfile = io.BufferedReader(
            _DeadlineReader(self.connection, time.monotonic() + self.server.request_seconds)
        )

    def parse_request(self):
        """The request line and headers, whole and well-formed, or False (answered 400/431 if
        malformed, closed without an answer if cut off)."""
        self.command, self.close_connection = None, True
        self.request_version = (
            "HTTP/1.0"  # the version our error answers carry (never HTTP/0.9's bare body)
        )
        line = self.raw_requestline
        self.requestline = line.decode("latin-1").rstrip("\r\n")[:200]
        if not line.endswith(b"\n"):
            return False  # cut off: the client closed in the middle of it
        match = REQUEST_LINE.fullmatch(line)
        if not match:
            self.send_error(400, "Bad request line")
            return False
        self.command, self.path, self.request_version = (
            part.decode("ascii") for part in match.groups()
        )
        lines = []
        while True:
            line = self.rfile.readline(MAX_LINE + 1)
            if len(line) > MAX_LINE:
                self.send_error(431, "Header line too long")
                return False
            if not line.endswith(b"\n"):
                return False  # cut off
            if line in (b"\r\n", b"\n"):
                break
            if len(lines) == MAX_HEADERS:
                self.send_error(431, "Too many headers")
                return False
            if not HEADER_LINE.fullmatch(line):
                self.send_error(400, "Bad header line")
                return False
            lines.append(line)
        self.headers = http.client.parse_headers(
            io.BytesIO(b"".join(lines) + b"\r\n"), _class=self.MessageClass
        )
        if self.command not in self.body_methods:
            self.arrived()
        return True

    def arrived(self):
        """The request is whole: from now on its connection is never closed to make room."""
        self.server.arrived(self.connection)
        self.connection.settimeout(self.reply_seconds)

    def reply(self, status, body=b"", content_type=TEXT, headers=()):
        """The answer: body (bytes, or text sent as UTF-8) with its Content-Type and Content-Length
        and `headers` ((name, value) pairs), the body left out for a HEAD."""
        if isinstance(body, str):
            body = body.encode()
        self.connection.settimeout(self.reply_seconds)  # also after a body that came late
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def read_body(self, content_type=None):
        """The request's body (a bytearray), whole and arrived(), or Refused (the module says
        which status for what); content_type: the one the request must have (e.g. application/json,
        parameters such as charset aside)."""
        if content_type and self.headers.get_content_type() != content_type:
            self.drain()
            raise Refused(415, f"Content-Type {content_type} required\n")
        length = self._length()
        if length is None:
            self.arrived()  # nothing more is read: its answer is not closed to make room
            if "Content-Length" not in self.headers:
                raise Refused(411, "Content-Length required\n")
            raise Refused(400, "bad Content-Length\n")
        if length > self.max_body:
            self.drain()
            raise Refused(413, f"body larger than {self.max_body} bytes\n")
        try:
            body = self._receive(length, keep=True)
        except TimeoutError:
            raise Refused(408, "body not received in time\n") from None
        if len(body) < length:  # the client ended it: nothing is done for it
            raise Refused(400, "body shorter than Content-Length\n")
        self.arrived()
        return body

    def drain(self):
        """Read and drop the announced body (at most DRAIN_MAX bytes, within the request's time), so
        that a client refused reads its answer, not a reset; then the request counts as arrived."""
        with contextlib.suppress(OSError):  # late or reset: the answer is tried all the same
            self._receive(min(self._length() or 0, DRAIN_MAX), keep=False)
        self.arrived()

    def _length(self):
        """The Content-Length, or None when missing or not decimal digits."""
        text = self.headers.get("Content-Length", "").strip()
        return int(text) if re.fullmatch(r"[0-9]{1,18}", text) else None

    def _receive(self, length, keep):
        """Up to length bytes of the body (fewer if the client ends it), CHUNK at a time."""
        body = bytearray()
        while length > 0:
            chunk = self.rfile.read(min(length, CHUNK))
            if not chunk:
                break
            length -= len(chunk)
            if keep:
                body += chunk
        return body

    def client_gone(self):
        """True when the client already closed its side (an aborted request): nothing to do for it."""
        try:
            # poll, not select: select() takes no descriptor above 1023
            poller = select.poll()
            poller.register(self.connection, select.POLLIN)
            # the plain socket's recv, also under TLS (an SSLSocket refuses MSG_PEEK): b"" is the TCP end
            return (
                bool(poller.poll(0))
                and socket.socket.recv(self.connection, 1, socket.MSG_PEEK) == b""
            )
        except OSError:
            return True


class Server(ThreadingHTTPServer):
    """A thread per connection, at most max_connections (see the module's docstring)."""

    daemon_threads = True
    request_queue_size = socket.SOMAXCONN
    tls = None  # an ssl.SSLContext (server side) to serve TLS with

    def __init__(
        self, address, handler, max_connections=MAX_CONNECTIONS, request_seconds=REQUEST_SECONDS
    ):
        if max_connections < 1 or not request_seconds > 0:
            raise ValueError(
                f"max_connections {max_connections} and request_seconds {request_seconds} must be positive"
            )
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.max_connections, self.request_seconds = max_connections, request_seconds
        self._lock = threading.Lock()
        self._open = set()  # connections with a thread (evicted ones are dropped at once)
        self._reading = {}  # connection -> monotonic time it was taken, while its request arrives
        self.evicted = self.refused = 0
        raise_descriptor_limit()
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        with self._lock:
            room = len(self._open) < self.max_connections or self._evict_oldest()
            if room:
                self._open.add(request)
                self._reading[request] = time.monotonic()
            else:
                self.refused += 1
        if not room:
            super().shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        # socketserver.ThreadingMixIn's, the socket first wrapped for TLS (here, in the connection's
        # own thread): from then on the handler, arrived(), an eviction and shutdown_request() all
        # have the wrapped socket.
        try:
            request = self._wrap(request)
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def _wrap(self, request):
        """request, or with tls its SSLSocket in its place (no I/O here: the handshake happens in
        the handler's first read, under the request's deadline)."""
        if self.tls is None:
            return request
        wrapped = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        with self._lock:
            if request in self._open:
                self._open.discard(request)
                self._open.add(wrapped)
                if request in self._reading:
                    self._reading[wrapped] = self._reading.pop(request)
                return wrapped
        # evicted between the wrap and the lock (its shutdown missed the moved descriptor)
        self._shut(wrapped)
        return wrapped

    @staticmethod
    def _shut(connection):
        try:
            # socket.socket's own shutdown, also for an SSLSocket (whose shutdown() would drop its
            # TLS state under the connection's thread): its thread's read ends, the request is cut off
            socket.socket.shutdown(connection, socket.SHUT_RDWR)
        except OSError:
            pass

    def _evict_oldest(self):
        """Close the connection sending its request the longest (the lock held); False if none."""
        if not self._reading:
            return False
        oldest = min(self._reading, key=self._reading.get)
        del self._reading[oldest]
        self._open.discard(oldest)
        self.evicted += 1
        self._shut(oldest)
        return True

    def arrived(self, connection):
        with self._lock:
            self._reading.pop(connection, None)

    def shutdown_request(self, request):
        # Forgotten before the close, under the lock: an eviction never shuts down a descriptor
        # number that a new connection has taken.
        with self._lock:
            self._reading.pop(request, None)
            self._open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # reset, broken pipe, timed out: the client's doing
            log.warning("%s: connection ended: %s", client_address[0], error)
        else:
            super().handle_error(request, client_address)
