#!/usr/bin/env python3
"""A self-hosted dead man's switch: pages when the pager's heartbeat pings stop.

The page receiver pings it after every heartbeat it wrote (--heartbeat-url-file), about once a
minute, as it would healthchecks.io or an Uptime Kuma push monitor. Run it on **another host**
(the host it watches can fail whole); it is also the stand-in for such a service in
alerts/tests/test_pager.py. Standard library only, with page_receiver.py beside it and
httpd/blockstack_http.py importable (PYTHONPATH=httpd, or the project's venv): the connections are
blockstack_http's (its docstring says what they get: one request per connection, whole within 5 s,
400 for a malformed one, held connections never stop the accept loop).

    PYTHONPATH=httpd python3 dead_mans_switch.py --listen 0.0.0.0:9468 --token-file /etc/blockstack/switch-token \\
        --timeout 300 --file /var/lib/blockstack-switch/events.jsonl --command 'mail -s "$SWITCH_SUMMARY" ops@example.com </dev/null'

    # on the watched host: the URL, with the token, in the receiver's --heartbeat-url-file
    echo "http://switch.example:9468/ping/$(cat /etc/blockstack/switch-token)" > .state/secrets/heartbeat-url

GET or POST /ping/TOKEN is a ping (anything else at /ping/ is 404: the token is the URL's secret,
as healthchecks.io's check UUID). No ping for --timeout seconds (counted from its own start too:
a pager never heard from is down) and it pages once: one JSON line appended to --file
({"at", "state": "down", "silent_seconds", "last_ping"}) with the page receiver's durable write,
and --command run with SWITCH_STATE, SWITCH_SUMMARY in its environment; the first ping after that
is the resolve (state "up"). A POST's body is read (blockstack_http's read_body: 411 without
Content-Length, 400 for a bad one, 413 past MAX_BODY) and ignored; one refused, late or cut off is
no ping. GET /status answers the state as JSON, GET /healthz "ok".
"""

import argparse
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time

import blockstack_http
from page_receiver import (
    append_line,  # beside this script: the same whole-line, fsynced append as pages
)

COMMAND_TIMEOUT = 60
MAX_BODY = (
    64 << 10
)  # a ping's body is ignored (healthchecks.io takes a log excerpt of up to 100 kB)


class Switch:
    """The state: when the last ping came, whether it is paging; events to --file and --command."""

    def __init__(self, timeout, events_file, command=None):
        self.timeout, self.events_file, self.command = timeout, events_file, command
        self.started = self.last_ping = time.time()
        self.pings, self.down = 0, False
        self.lock = threading.Lock()

    def ping(self):
        with self.lock:
            self.last_ping, self.pings = time.time(), self.pings + 1
            if self.down:
                self.down = False
                self._event("up", 0.0)

    def check(self):
        with self.lock:
            silent = time.time() - self.last_ping
            if not self.down and silent > self.timeout:
                self.down = True
                self._event("down", silent)

    def status(self):
        with self.lock:
            return {
                "state": "down" if self.down else "up",
                "last_ping": self.last_ping if self.pings else None,
                "pings": self.pings,
                "timeout": self.timeout,
            }

    def _event(self, state, silent):
        summary = (
            f"blockstack pager silent for {silent:.0f} s: no heartbeat (timeout {self.timeout:.0f} s)"
            if state == "down"
            else "blockstack pager heartbeat back"
        )
        record = {
            "at": time.time(),
            "state": state,
            "silent_seconds": round(silent, 1),
            "last_ping": self.last_ping if self.pings else None,
            "summary": summary,
        }
        sys.stderr.write(summary + "\n")
        try:
            append_line(self.events_file, (json.dumps(record, sort_keys=True) + "\n").encode())
        except OSError as e:
            sys.stderr.write(f"could not write {self.events_file}: {e}\n")
        if self.command:
            env = dict(os.environ, SWITCH_STATE=state, SWITCH_SUMMARY=summary)
            try:
                subprocess.run(
                    self.command, shell=True, env=env, timeout=COMMAND_TIMEOUT, check=True
                )
            except (OSError, subprocess.SubprocessError) as e:
                sys.stderr.write(f"--command failed: {e}\n")


class Handler(blockstack_http.Handler):
    server_version = "blockstack-dead-mans-switch/1"
    body_methods = ("POST",)  # whole once its body is read
    max_body = MAX_BODY

    def do_GET(self):
        path = self.path.split("?")[0]
        if path.startswith("/ping/"):
            if not hmac.compare_digest(path[len("/ping/") :].encode(), self.server.token):
                return self.reply(404, b"not found\n")
            self.server.switch.ping()
            return self.reply(200, b"ok\n")
        if path == "/status":
            return self.reply(
                200, json.dumps(self.server.switch.status()).encode() + b"\n", "application/json"
            )
        if path in ("/", "/healthz"):
            return self.reply(200, b"ok\n")
        self.reply(404, b"not found\n")

    do_HEAD = do_GET  # healthchecks.io takes any of them

    def do_POST(self):
        try:
            self.read_body()  # read and ignored
        except blockstack_http.Refused as refused:  # cut off, late or refused: no ping
            return self.reply(refused.status, refused.reason)
        self.do_GET()

    def log_message(self, fmt, *args):
        pass  # every minute a ping: the events are the log


def serve(listen, switch, token):
    host, _, port = listen.rpartition(":")
    server = blockstack_http.Server((host.strip("[]") or "127.0.0.1", int(port)), Handler)
    server.switch, server.token = switch, token.encode()
    return server


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:9468", help="host:port (default %(default)s)")
    p.add_argument(
        "--token-file", required=True, help="file holding the secret of the ping URL /ping/TOKEN"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300,
        help="seconds without a ping before it pages (default %(default)s)",
    )
    p.add_argument(
        "--file",
        required=True,
        help="JSON-lines file each page (down) and resolve (up) is appended to",
    )
    p.add_argument(
        "--command",
        help="shell command run on each page and resolve (SWITCH_STATE, SWITCH_SUMMARY set)",
    )
    args = p.parse_args(argv)
    with open(args.token_file) as f:
        token = f.read().strip()
    if not token:
        raise SystemExit(f"{args.token_file} is empty")
    switch = Switch(args.timeout, args.file, args.command)
    server = serve(args.listen, switch, token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stderr.write(
        f"listening on {args.listen}, paging after {args.timeout:.0f} s without a ping\n"
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(min(1.0, args.timeout / 10)):
            switch.check()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
