#!/usr/bin/env python3
"""A local Alertmanager webhook receiver: every notification becomes one JSON line in a file.

Alertmanager POSTs its webhook payload (version 4: receiver, status, alerts, groupLabels, ...)
to http://127.0.0.1:PORT/page or /ticket (--path); this appends

    {"notification": <the payload as sent>, "path": "/page", "received_at": <unix seconds>}

to --file and answers 200, so a page is visible (`tail -f`) and testable. GET / and GET /healthz
answer "ok". Standard library only; listens on 127.0.0.1 unless told otherwise.

    python3 alerts/receiver/page_receiver.py --listen 127.0.0.1:9466 --file .state/config/pages.jsonl

What it takes and what it refuses:
- A line is written whole or not at all: one write(2) of the complete line, fsynced; if that
  fails (a full disk) the file is truncated back to its previous length and the answer is 503,
  which Alertmanager retries. Earlier lines are never touched.
- 400 for a body that is not standard JSON (NaN, Infinity, numbers that overflow to them), is
  nested too deeply to decode, or is not a webhook notification (an object with string
  `receiver` and `status` and a list of `alerts`, each an object with string `status` and
  string-valued `labels`). Alertmanager does not retry a 4xx: the error is in its log.
- 411 without Content-Length, 413 past MAX_BODY (1 MiB: ~700 alerts of ~1.5 KB in one group;
  `max_alerts` on the webhook config keeps Alertmanager below it).
- At most --workers requests at once; further connections wait in the listen backlog (1024).
  Each connection (HTTP/1.0, one request) must arrive whole within --request-timeout seconds,
  or it is dropped (408 when the headers came). Memory: at most workers x MAX_BODY of bodies
  (held as they arrive, not as announced) and one notification decoded at a time.
"""
import argparse
import contextlib
import io
import json
import math
import os
import re
import signal
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_LISTEN = "127.0.0.1:9466"
WEBHOOK_PATHS = ("/page", "/ticket")  # the receivers of alerts/alertmanager.yml
MAX_BODY = 1 << 20
WORKERS = 32
REQUEST_TIMEOUT = 10.0  # seconds for a whole request to arrive; Alertmanager sends one in milliseconds
REPLY_TIMEOUT = 5.0


class NotWebhook(ValueError):
    pass


def _no_constant(name):
    raise NotWebhook(f"{name} is not standard JSON")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise NotWebhook(f"{text[:20]} overflows a float")
    return value


def decode(body):
    """The notification in body (bytes), checked; NotWebhook saying what is wrong."""
    try:
        payload = json.loads(body, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise NotWebhook("nested too deeply") from None
    except NotWebhook:
        raise
    except ValueError as e:  # also UnicodeDecodeError, and int() refusing 4300+ digits
        raise NotWebhook(f"not JSON: {str(e)[:100]}") from None
    if not isinstance(payload, dict):
        raise NotWebhook("not a JSON object")
    for key in ("receiver", "status"):
        if not isinstance(payload.get(key), str):
            raise NotWebhook(f"`{key}` is not a string")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise NotWebhook("`alerts` is not a list")
    for alert in alerts:
        if not isinstance(alert, dict) or not isinstance(alert.get("status"), str):
            raise NotWebhook("an alert is not an object with a string `status`")
        labels = alert.get("labels")
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise NotWebhook("an alert's `labels` are not an object of strings")
    return payload


def append_line(path, line):
    """Append line (bytes ending in a newline) to path whole, or raise OSError with the file as it was."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # the last line was cut (a crash): leave it, start a new one
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"wrote {written} of {len(line)} bytes (disk full?)")
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, size)
            os.fsync(fd)
            raise
    finally:
        os.close(fd)


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


class Handler(BaseHTTPRequestHandler):
    server_version = "blockstack-page-receiver/2"

    def setup(self):
        super().setup()
        self.rfile.close()
        deadline = time.monotonic() + self.server.request_timeout
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline))

    def do_GET(self):
        if urllib.parse.urlsplit(self.path).path in ("/", "/healthz"):
            self._reply(200, b"ok\n")
        else:
            self._reply(404, b"not found\n")

    def do_POST(self):
        path = urllib.parse.urlsplit(self.path).path
        if path not in self.server.paths:
            return self._reply(404, b"not a webhook path\n")
        if "Content-Length" not in self.headers:
            return self._reply(411, b"Content-Length required\n")
        if not re.fullmatch(r"[0-9]{1,18}", self.headers["Content-Length"].strip()):
            return self._reply(400, b"bad Content-Length\n")
        length = int(self.headers["Content-Length"])
        if length > MAX_BODY:
            with contextlib.suppress(TimeoutError):
                self._read(length, keep=False)  # so that the client reads our answer, not a reset
            return self._reply(413, b"body larger than %d bytes\n" % MAX_BODY)
        try:
            body = self._read(length)
        except TimeoutError:
            return self._reply(408, b"body not received in time\n")
        if len(body) < length:
            return self._reply(400, b"body shorter than Content-Length\n")
        with self.server.lock:  # one notification decoded and written at a time
            try:
                record = {"received_at": time.time(), "path": path, "notification": decode(body)}
                line = json.dumps(record, sort_keys=True, allow_nan=False) + "\n"
            except (NotWebhook, RecursionError) as e:
                return self._reply(400, f"not a webhook notification: {e}\n".encode())
            try:
                append_line(self.server.out_path, line.encode())
            except OSError as e:
                self.log_error("could not write %s: %s", self.server.out_path, e)
                return self._reply(503, f"could not write the notification: {e}\n".encode())
        self._reply(200, b"ok\n")

    def _read(self, length, keep=True):
        """The body, 64 KiB at a time: memory grows with what was received, not with what was announced."""
        body = bytearray()
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                break
            length -= len(chunk)
            if keep:
                body += chunk
        return body

    def _reply(self, code, body):
        self.connection.settimeout(REPLY_TIMEOUT)
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


class Server(ThreadingHTTPServer):
    request_queue_size = 1024  # listen backlog: a burst of connections waits here instead of being reset

    def __init__(self, address, out_path, paths=WEBHOOK_PATHS, workers=WORKERS, request_timeout=REQUEST_TIMEOUT):
        super().__init__(address, Handler)
        self.out_path, self.paths, self.request_timeout = out_path, frozenset(paths), request_timeout
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(workers)

    def process_request(self, request, client_address):
        self.slots.acquire()  # a free worker, or wait (the connection stays in the backlog meanwhile)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def received(path, since=0.0):
    """[(record, alert)] for every alert of every notification in a file this receiver wrote,
    received at or after `since` (Unix seconds), oldest first; [] before the first notification."""
    try:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return [(r, a) for r in records if r["received_at"] >= since for a in r["notification"]["alerts"]]


def serve(listen, out_path, **options):
    host, _, port = listen.rpartition(":")
    return Server((host.strip("[]") or "127.0.0.1", int(port)), out_path, **options)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="host:port (default %(default)s)")
    p.add_argument("--file", required=True, help="JSON-lines file every notification is appended to")
    p.add_argument("--path", action="append", dest="paths",
                   help="a webhook path to accept POSTs on, repeatable (default %s)" % " ".join(WEBHOOK_PATHS))
    p.add_argument("--workers", type=int, default=WORKERS, help="requests served at once (default %(default)s)")
    p.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT,
                   help="seconds for a whole request to arrive (default %(default)s)")
    args = p.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.file)), exist_ok=True)
    server = serve(args.listen, args.file, paths=args.paths or WEBHOOK_PATHS, workers=args.workers,
                   request_timeout=args.request_timeout)
    sys.stderr.write(f"listening on {args.listen}, writing {args.file}\n")
    # SIGTERM (supervisord, systemd) ends serve_forever and server_close waits for the requests in
    # flight; killed by SIGTERM's default action instead, a write of several pages could be cut.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
