#!/usr/bin/env python3
"""A local Alertmanager webhook receiver: every notification becomes one JSON line in a file.

Alertmanager POSTs its webhook payload (version 4: receiver, status, alerts, groupLabels, ...)
to http://127.0.0.1:PORT/page or /ticket (--path); this appends

    {"notification": <the payload as sent>, "path": "/page", "received_at": <unix seconds>}

to --file and answers 200, so a page is visible (`tail -f`) and testable. GET / and GET /healthz
answer "ok", GET /metrics its own counters (Prometheus text format). Standard library only
(blockstack_http is too); listens on 127.0.0.1 unless told otherwise.

The heartbeat: a POST to /watchdog (the always-firing BlockStackWatchdog, about every minute) is
written as pages are (append_line, fsynced; 503 and a write error counted when that fails) to a
new file that then replaces HEARTBEAT_FILE beside the pages file: each heartbeat needs a free
block of the pages' filesystem (an append could fit in the last block of a full one). Only once
it is written does /metrics move
blockstack_receiver_watchdog_last_seconds (BlockStackHeartbeatStale reads it) and, with
--heartbeat-url-file, the receiver ping the off-host dead man's switch (a healthchecks.io-style
URL, GET, off the request's thread): rule evaluation, Alertmanager, the notification and the
durable write are proven every minute, or the switch pages.

    .venv/bin/python alerts/receiver/page_receiver.py --listen 127.0.0.1:9466 --file .state/config/pages.jsonl \
        --token-file .state/secrets/receiver-token [--heartbeat-url-file .state/secrets/heartbeat-url]

What it takes and what it refuses:
- 401 for a POST without `Authorization: Bearer <the token in --token-file>` (Alertmanager's
  webhook http_config sends it), 415 for a Content-Type other than application/json: a web page
  in a browser on this host can send neither (a foreign origin's POST with a custom header or a
  JSON content type needs a CORS preflight, which this receiver never grants).
- A line is written whole or not at all: one write(2) of the complete line, fsynced; if that
  fails (a full disk) the file is truncated back to its previous length and the answer is 503,
  which Alertmanager retries. Earlier lines are never touched.
- 400 for a body that is not standard JSON (NaN, Infinity, numbers that overflow to them), is
  nested too deeply to decode, or is not a webhook notification (an object with string
  `receiver` and `status` and a list of `alerts`, each an object with string `status` and
  string-valued `labels`). Alertmanager does not retry a 4xx: the error is in its log.
- The body as blockstack_http's read_body takes it: 411 without Content-Length, 400 for a bad
  one, 413 past MAX_BODY (1 MiB: ~700 alerts of ~1.5 KB in one group; `max_alerts` on the webhook
  config keeps Alertmanager below it), 408 for a body late, 400 for one cut short.
- The connections are httpd/blockstack_http.py's (its docstring says what they get): each
  (HTTP/1.0, one request) must arrive whole, body included, within --request-timeout seconds, or
  it is dropped (408 when the headers came); 400 for a malformed request line or header, no
  HTTP/0.9; nothing is written for a request cut off. At most --connections connections at once
  (a thread each, 256 KiB of stack); at that number the one sending its request the longest is
  closed for a new one, so connections held open by any local user never stop the accept loop
  (a page arrives in one go and is not the one closed). Of those, at most --workers authorized
  requests read their body at once: a connection that sends nothing (or only a request line)
  holds a thread, not a worker. Memory:
  at most workers x MAX_BODY of bodies (held as they arrive, not as announced) and one
  notification decoded at a time.
- Rotation: before a line would take the file past --max-bytes, the file is renamed to FILE.1
  (FILE.1 to FILE.2, ... up to --backups; the oldest goes), under the same lock as the writes:
  no notification is lost or split between files; received() reads the backups too.
"""

import argparse
import collections
import contextlib
import hmac
import json
import math
import os
import re
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request

import blockstack_http

DEFAULT_LISTEN = "127.0.0.1:9466"
WEBHOOK_PATHS = ("/page", "/ticket")  # the receivers of alerts/alertmanager.yml
WATCHDOG_PATH = "/watchdog"  # the dead-man's-switch receiver: the heartbeat (Heartbeat)
HEARTBEAT_FILE = "heartbeat.jsonl"  # in the pages file's directory
PING_TIMEOUT = 10.0  # seconds for the dead man's switch to answer a ping
MAX_BODY = 1 << 20
WORKERS = 32
CONNECTIONS = 1024
MAX_BYTES = 64 << 20  # the pages file is rotated before it grows past this
BACKUPS = 4
REQUEST_TIMEOUT = (
    10.0  # seconds for a whole request to arrive; Alertmanager sends one in milliseconds
)
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


def rotate(path, backups):
    """path -> path.1 -> path.2 ... -> path.BACKUPS (dropped); each step one rename(2)."""
    for i in range(backups - 1, 0, -1):
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{path}.{i}", f"{path}.{i + 1}")
    os.replace(path, f"{path}.1") if backups else os.unlink(path)
    dirfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


def append_line(path, line, max_bytes=None, backups=BACKUPS):
    """Append line (bytes ending in a newline) to path whole, or raise OSError with the file as it
    was; the file is rotated first if the line would take it past max_bytes."""
    with contextlib.suppress(FileNotFoundError):
        if max_bytes and os.stat(path).st_size and os.stat(path).st_size + len(line) > max_bytes:
            rotate(path, backups)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o640)
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


class Heartbeat:
    """The watchdog's proof: when a heartbeat was last written to `path`, and, with `url`, a ping of
    the off-host dead man's switch after each one (on a thread of its own, one at a time: a slow
    switch never holds a page; pings due meanwhile become one)."""

    def __init__(self, path, url=None):
        self.path, self.url = path, url
        self.started = time.time()
        self.written_at = self.pinged_at = 0.0
        self.pings = collections.Counter({"ok": 0, "failed": 0})
        self._due = threading.Event()
        if url:
            threading.Thread(target=self._pinger, name="heartbeat-ping", daemon=True).start()

    def write(self, line):
        """line (bytes) as the heartbeat file's content: appended to a new file (append_line, fsynced),
        which then replaces the last one; the previous heartbeat holds its block until then."""
        new = self.path + ".new"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(new)
            append_line(new, line)
            os.replace(new, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(new)
            raise

    def written(self, at):
        self.written_at = at
        self._due.set()

    def _pinger(self):
        while True:
            self._due.wait()
            self._due.clear()
            try:
                with urllib.request.urlopen(self.url, timeout=PING_TIMEOUT) as answer:
                    answer.read(1 << 16)
                self.pinged_at, result = time.time(), "ok"
            except (OSError, ValueError) as e:  # urllib's HTTPError and URLError are OSErrors
                result = "failed"
                sys.stderr.write(
                    f"could not ping the dead man's switch: {e}\n"
                )  # not the URL: it is the secret
            self.pings[result] += 1

    def metrics(self):
        lines = [
            "# HELP blockstack_receiver_watchdog_last_seconds Unix time of the last heartbeat (watchdog notification) "
            "written to the heartbeat file (0: none since the start).",
            "# TYPE blockstack_receiver_watchdog_last_seconds gauge",
            f"blockstack_receiver_watchdog_last_seconds {self.written_at}",
            "# HELP blockstack_receiver_heartbeat_pings_total Pings of the off-host dead man's switch, by result.",
            "# TYPE blockstack_receiver_heartbeat_pings_total counter",
        ]
        lines += [
            f'blockstack_receiver_heartbeat_pings_total{{result="{r}"}} {n}'
            for r, n in sorted(self.pings.items())
        ]
        lines += [
            "# HELP blockstack_receiver_heartbeat_ping_last_seconds Unix time of the last ping the switch answered (0: none).",
            "# TYPE blockstack_receiver_heartbeat_ping_last_seconds gauge",
            f"blockstack_receiver_heartbeat_ping_last_seconds {self.pinged_at}",
            "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.started}",
        ]
        return lines


class Handler(blockstack_http.Handler):
    server_version = "blockstack-page-receiver/2"
    body_methods = ("POST",)  # a POST is whole once read_body has its body
    reply_seconds = REPLY_TIMEOUT
    max_body = MAX_BODY

    def do_GET(self):
        path = urllib.parse.urlsplit(self.path).path
        if path in ("/", "/healthz"):
            self.reply(200, b"ok\n")
        elif path == "/metrics":
            self.reply(200, self.server.metrics().encode(), "text/plain; version=0.0.4")
        else:
            self.reply(404, b"not found\n")

    def do_POST(self):
        code, answer = self._post()
        self.server.count(self.path, code)
        self.reply(code, answer)

    def _post(self):
        path = urllib.parse.urlsplit(self.path).path
        if path not in self.server.paths and path != WATCHDOG_PATH:
            return 404, b"not a webhook path\n"
        if not self.server.authorized(self.headers.get("Authorization", "")):
            self.drain()
            return 401, b"Authorization: Bearer <token> required\n"
        with self.server.slots:  # a worker: at most --workers bodies read and held at once
            try:
                body = self.read_body("application/json")
            except blockstack_http.Refused as refused:
                return refused.status, refused.reason
            return self._write(path, body)

    def _write(self, path, body):
        with self.server.lock:  # one notification decoded and written at a time
            try:
                record = {"received_at": time.time(), "path": path, "notification": decode(body)}
                line = json.dumps(record, sort_keys=True, allow_nan=False) + "\n"
            except (NotWebhook, RecursionError) as e:
                return 400, f"not a webhook notification: {e}\n".encode()
            heartbeat = path == WATCHDOG_PATH
            out_path = self.server.heartbeat.path if heartbeat else self.server.out_path
            try:
                if heartbeat:
                    self.server.heartbeat.write(line.encode())
                else:
                    append_line(out_path, line.encode(), self.server.max_bytes, self.server.backups)
            except OSError as e:
                self.server.write_errors += 1
                self.log_error("could not write %s: %s", out_path, e)
                return 503, f"could not write the notification: {e}\n".encode()
            if heartbeat:
                self.server.heartbeat.written(record["received_at"])
        return 200, b"ok\n"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


class Server(blockstack_http.Server):
    daemon_threads = False  # server_close waits for the requests in flight (a page being written)

    def __init__(
        self,
        address,
        out_path,
        paths=WEBHOOK_PATHS,
        workers=WORKERS,
        request_timeout=REQUEST_TIMEOUT,
        token=None,
        connections=CONNECTIONS,
        max_bytes=MAX_BYTES,
        backups=BACKUPS,
        statfs=(),
        heartbeat_url=None,
    ):
        """token: the bearer token every POST must carry (None: no check, for in-process tests).
        statfs: directories whose filesystem's free space /metrics reports (the pages file's is one).
        heartbeat_url: the off-host dead man's switch pinged after each heartbeat written (Heartbeat)."""
        super().__init__(
            address, Handler, max_connections=connections, request_seconds=request_timeout
        )
        self.out_path, self.paths, self.request_timeout = (
            out_path,
            frozenset(paths),
            request_timeout,
        )
        self.token = token.encode() if token else None
        self.max_bytes, self.backups = max_bytes, backups
        self.statfs = list(dict.fromkeys([os.path.dirname(os.path.abspath(out_path)), *statfs]))
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(workers)
        self.answers = collections.Counter()  # (path, code) -> requests
        self.write_errors = 0
        self.heartbeat = Heartbeat(
            os.path.join(os.path.dirname(os.path.abspath(out_path)), HEARTBEAT_FILE), heartbeat_url
        )

    def authorized(self, header):
        if self.token is None:
            return True
        scheme, _, credential = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credential.strip().encode(), self.token
        )

    def count(self, path, code):
        path = urllib.parse.urlsplit(path).path
        with self.lock:
            self.answers[
                (path if path in self.paths or path == WATCHDOG_PATH else "other", code)
            ] += 1

    def metrics(self):
        """The receiver's own metrics, Prometheus text format: what it answered, whether it can
        write, how full its filesystems are, when the watchdog last arrived."""
        with self.lock:
            answers, errors, heartbeat = (
                sorted(self.answers.items()),
                self.write_errors,
                self.heartbeat.metrics(),
            )
        lines = [
            "# HELP blockstack_receiver_requests_total POST requests answered, by path and HTTP status.",
            "# TYPE blockstack_receiver_requests_total counter",
        ]
        lines += [
            f'blockstack_receiver_requests_total{{path="{p}",code="{c}"}} {n}'
            for (p, c), n in answers
        ]
        lines += [
            "# HELP blockstack_receiver_write_errors_total Notifications that could not be written to the pages file (answered 503).",
            "# TYPE blockstack_receiver_write_errors_total counter",
            f"blockstack_receiver_write_errors_total {errors}",
            *heartbeat,
        ]
        for name, help_text in (("avail", "Bytes free to unprivileged users"), ("size", "Size")):
            lines += [
                f"# HELP blockstack_receiver_filesystem_{name}_bytes {help_text} of the filesystem holding path.",
                f"# TYPE blockstack_receiver_filesystem_{name}_bytes gauge",
            ]
            for path in self.statfs:
                try:
                    st = os.statvfs(path)
                except OSError:
                    continue
                value = st.f_bavail * st.f_frsize if name == "avail" else st.f_blocks * st.f_frsize
                lines.append(
                    f'blockstack_receiver_filesystem_{name}_bytes{{path="{_escape(path)}"}} {value}'
                )
        return "\n".join(lines) + "\n"


def _escape(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def received(path, since=0.0):
    """[(record, alert)] for every alert of every notification in a file this receiver wrote and
    its rotated backups, received at or after `since` (Unix seconds), oldest first; [] before the
    first notification."""
    backups = sorted(
        (
            int(m.group(1))
            for m in (
                re.fullmatch(re.escape(os.path.basename(path)) + r"\.([0-9]+)", name)
                for name in os.listdir(os.path.dirname(os.path.abspath(path)))
            )
            if m
        ),
        reverse=True,
    )
    records = []
    for name in [f"{path}.{i}" for i in backups] + [path]:
        try:
            with open(name) as f:
                records += [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            pass
    return [
        (r, a) for r in records if r["received_at"] >= since for a in r["notification"]["alerts"]
    ]


def serve(listen, out_path, **options):
    host, _, port = listen.rpartition(":")
    return Server((host.strip("[]") or "127.0.0.1", int(port)), out_path, **options)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="host:port (default %(default)s)")
    p.add_argument(
        "--file", required=True, help="JSON-lines file every notification is appended to"
    )
    p.add_argument(
        "--path",
        action="append",
        dest="paths",
        help="a webhook path to accept POSTs on, repeatable (default %s)" % " ".join(WEBHOOK_PATHS),
    )
    p.add_argument(
        "--token-file",
        required=True,
        help="file holding the bearer token every POST must carry (Alertmanager's http_config credentials_file)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=WORKERS,
        help="request bodies read at once (default %(default)s)",
    )
    p.add_argument(
        "--connections",
        type=int,
        default=CONNECTIONS,
        help="connections held at once (default %(default)s)",
    )
    p.add_argument(
        "--max-bytes",
        type=int,
        default=MAX_BYTES,
        help="rotate the file before it grows past this (default %(default)s)",
    )
    p.add_argument(
        "--backups",
        type=int,
        default=BACKUPS,
        help="rotated files kept: FILE.1 ... (default %(default)s)",
    )
    p.add_argument(
        "--statfs",
        action="append",
        default=[],
        help="a directory whose filesystem's free space /metrics reports, repeatable (the file's is always reported)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=REQUEST_TIMEOUT,
        help="seconds for a whole request to arrive (default %(default)s)",
    )
    p.add_argument(
        "--heartbeat-url-file",
        help="file holding the URL of an off-host dead man's switch (healthchecks.io, Uptime Kuma push, "
        "dead_mans_switch.py), fetched after each heartbeat written",
    )
    args = p.parse_args(argv)
    heartbeat_url = None
    if args.heartbeat_url_file:
        with open(args.heartbeat_url_file) as f:
            heartbeat_url = f.read().strip()
        if urllib.parse.urlsplit(heartbeat_url).scheme not in ("http", "https"):
            raise SystemExit(f"{args.heartbeat_url_file}: not an http(s) URL")
    os.makedirs(os.path.dirname(os.path.abspath(args.file)), exist_ok=True)
    with open(args.token_file) as f:
        token = f.read().strip()
    if not token:
        raise SystemExit(f"{args.token_file} is empty")
    threading.stack_size(256 << 10)  # a thread per connection: 1024 idle ones stay small
    server = serve(
        args.listen,
        args.file,
        paths=args.paths or WEBHOOK_PATHS,
        workers=args.workers,
        request_timeout=args.request_timeout,
        token=token,
        connections=args.connections,
        max_bytes=args.max_bytes,
        backups=args.backups,
        statfs=args.statfs,
        heartbeat_url=heartbeat_url,
    )
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
