#!/usr/bin/env python3
"""A local Alertmanager webhook receiver: every notification becomes one JSON line in a file.

Alertmanager POSTs its webhook payload (version 4: receiver, status, alerts, groupLabels, ...)
to http://127.0.0.1:PORT/<path>; this appends

    {"received_at": <unix seconds>, "path": "/page", "notification": <the payload as sent>}

to --file and answers 200, so a page is visible (`tail -f`) and testable. GET /healthz answers
"ok". Standard library only; listens on 127.0.0.1 unless told otherwise.

    python3 alerts/receiver/page_receiver.py --listen 127.0.0.1:9466 --file .state/notifications.jsonl
"""
import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_LISTEN = "127.0.0.1:9466"
MAX_BODY = 8 << 20  # Alertmanager caps a notification far below this; refuse anything larger.


class Handler(BaseHTTPRequestHandler):
    server_version = "blockstack-page-receiver/1"

    def do_GET(self):
        if self.path == "/healthz":
            self._reply(200, b"ok\n")
        else:
            self._reply(404, b"not found\n")

    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            return self._reply(400, b"bad Content-Length\n")
        if length <= 0 or length > MAX_BODY:
            return self._reply(400, b"body missing or too large\n")
        try:
            payload = json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError):
            return self._reply(400, b"body is not JSON\n")
        record = {"received_at": time.time(), "path": self.path, "notification": payload}
        line = json.dumps(record, sort_keys=True) + "\n"
        with self.server.lock:
            with open(self.server.out_path, "a") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        self._reply(200, b"ok\n")

    def _reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


def serve(listen, out_path):
    host, _, port = listen.rpartition(":")
    server = ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", int(port)), Handler)
    server.out_path = out_path
    server.lock = threading.Lock()
    return server


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="host:port (default %(default)s)")
    p.add_argument("--file", required=True, help="JSON-lines file every notification is appended to")
    args = p.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.file)), exist_ok=True)
    server = serve(args.listen, args.file)
    sys.stderr.write(f"listening on {args.listen}, writing {args.file}\n")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
