"""The fleet's alert gate: what an agent host's credential opens on the central side, and nothing
more. One gate stands in front of each central Alertmanager peer (roles.Central); the peer itself
listens on 127.0.0.1 only, behind the admin password.

    alert_gate.py --listen ADDR:PORT --alertmanager http://127.0.0.1:PORT
                  --credentials push-credentials.json --admin-password-file FILE [--tls-cert F --tls-key F]
                  [--connections N] [--request-timeout SECONDS]

A request is let through only when it is `POST /api/v2/alerts` (what Prometheus sends), with
`Content-Type: application/json`, basic auth of a host named in the credentials file (user = the
host, password = its push secret; the file holds sha256 of each secret: they are generated 144-bit
secrets, so a slow hash would buy nothing), and every alert in it labelled `host` = that host (a
host cannot raise, or resolve early, another host's alerts). The gate forwards it to its
Alertmanager with the admin password and relays the answer. Anything else: 401 without a valid
credential, 403 with one (silences, reads, other hosts' alerts), 400 for a body that is not a JSON
list of alerts, and what blockstack_http's read_body refuses: 415 for a Content-Type other than
application/json, 411 without Content-Length, 400 for a bad one, 413 past MAX_BODY, 408 for a body
late, 400 for one shorter than its Content-Length. Alertmanager's own web config cannot restrict
a user to one path, hence this program.

`GET /-/healthy` answers 200 without credentials (the gate's own health, nothing forwarded). The
credentials file is re-read when it changes: adding or revoking a host needs no restart.

The connections are httpd/blockstack_http.py's (its docstring says what they get): HTTP/1.0, one
request per connection (Prometheus's pushes need no more), which must arrive whole, body and TLS
handshake included, within --request-timeout seconds, or it is closed unanswered; 400 for a
malformed request line or header, no HTTP/0.9; nothing is forwarded for a request cut off. At most
--connections at once (a thread each); at that number the one sending its request the longest is
closed for a new one, so connections held open do not delay a push. Standard library only
(blockstack_http is too; it runs as a script under its own user).
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import ssl
import sys
import threading
import urllib.error
import urllib.request

import blockstack_http

PUSH_PATH = "/api/v2/alerts"
MAX_BODY = 8 << 20  # Prometheus sends at most 64 alerts per request; 8 MiB is far above that


def digest(password):
    return hashlib.sha256(password.encode()).hexdigest()


class Credentials:
    """{host: sha256 hex of its push secret} from a JSON file, re-read when its mtime changes."""

    def __init__(self, path):
        self.path, self.key, self.hashes = path, None, {}
        self.lock = threading.Lock()

    def host(self, authorization):
        """The host whose push secret `authorization` (an Authorization header) carries, else None."""
        if not authorization or not authorization.startswith("Basic "):
            return None
        try:
            user, _, password = (
                base64.b64decode(authorization[6:], validate=True).decode().partition(":")
            )
        except (ValueError, UnicodeDecodeError):
            return None
        expected = self._hashes().get(user)
        return user if expected and hmac.compare_digest(expected, digest(password)) else None

    def _hashes(self):
        with self.lock:
            try:
                st = os.stat(self.path)
                key = (st.st_mtime_ns, st.st_size, st.st_ino)
                if key != self.key:
                    with open(self.path) as f:
                        self.hashes, self.key = json.load(f), key
            except (OSError, ValueError) as e:  # keep the last good file; say why
                print(f"alert_gate: credentials {self.path}: {e}", file=sys.stderr, flush=True)
            return self.hashes


class Gate(blockstack_http.Handler):
    server_version = "blockstack-alert-gate"
    sys_version = ""
    body_methods = ("POST",)  # a POST is whole once its body is read (arrived())
    max_body = MAX_BODY

    def do_GET(self):
        if self.path == "/-/healthy":
            return self.reply(200, "OK\n")
        self.refuse()

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_GET

    def do_POST(self):
        if self.path != PUSH_PATH:
            return self.refuse()
        host = self.server.credentials.host(self.headers.get("Authorization"))
        if host is None:
            self.drain()
            return self.unauthorized()
        try:
            body = self.read_body("application/json")  # cut off, late or refused: nothing forwarded
        except blockstack_http.Refused as refused:
            return self.reply(refused.status, refused.reason)
        try:
            alerts = json.loads(body)
            foreign = {str(a.get("labels", {}).get("host")) for a in alerts} - {host}
        except (ValueError, AttributeError, TypeError):
            return self.reply(400, "expected a JSON list of alerts\n")
        if foreign:
            self.log_message("refused %s's push of alerts for %s", host, ", ".join(sorted(foreign)))
            return self.reply(403, f"{host} may push only alerts labelled host={host}\n")
        self.forward(body)

    def authenticated(self):
        host = self.server.credentials.host(self.headers.get("Authorization"))
        if host is None:
            self.unauthorized()
        return host

    def unauthorized(self):
        self.reply(
            401,
            "unauthorized\n",
            headers=[("WWW-Authenticate", 'Basic realm="blockstack alert gate"')],
        )

    def refuse(self):
        """Anything but a push: 401 without a valid host credential, 403 with one."""
        self.drain()
        if self.authenticated() is not None:
            self.reply(403, f"only POST {PUSH_PATH}\n")

    def forward(self, body):
        req = urllib.request.Request(
            self.server.upstream + PUSH_PATH,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": self.server.admin_authorization(),
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                self.reply(r.status, r.read())
        except urllib.error.HTTPError as e:
            self.reply(e.code, e.read())
        except OSError as e:
            self.reply(502, f"alertmanager unreachable: {e}\n")

    def log_request(self, code="-", size="-"):
        if str(code) not in ("200", "202"):  # refusals and failures only
            super().log_request(code, size)


class Server(blockstack_http.Server):
    def __init__(
        self,
        address,
        upstream,
        credentials,
        admin_password_file,
        tls=None,
        max_connections=blockstack_http.MAX_CONNECTIONS,
        request_seconds=blockstack_http.REQUEST_SECONDS,
    ):
        """tls: (certificate file, key file); the handshake is done in the connection's own thread,
        within request_seconds (blockstack_http.Server.tls)."""
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(*tls)
            self.tls = context
        super().__init__(
            address, Gate, max_connections=max_connections, request_seconds=request_seconds
        )
        self.upstream, self.credentials = upstream.rstrip("/"), Credentials(credentials)
        self.admin_password_file = admin_password_file

    def admin_authorization(self):
        with open(self.admin_password_file) as f:
            return "Basic " + base64.b64encode(f"admin:{f.read().strip()}".encode()).decode()


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--listen", required=True, metavar="ADDR:PORT")
    p.add_argument(
        "--alertmanager", required=True, metavar="URL", help="the Alertmanager behind the gate"
    )
    p.add_argument(
        "--credentials", required=True, help="JSON {host: sha256 hex of its push secret}"
    )
    p.add_argument(
        "--admin-password-file", required=True, help="Alertmanager's admin password (user admin)"
    )
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument(
        "--connections",
        type=int,
        default=blockstack_http.MAX_CONNECTIONS,
        help="connections held at once (default %(default)s)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=blockstack_http.REQUEST_SECONDS,
        help="seconds for a whole request, TLS handshake included, to arrive (default %(default)s)",
    )
    args = p.parse_args(argv)
    addr, _, port = args.listen.rpartition(":")
    tls = (args.tls_cert, args.tls_key) if args.tls_cert else None
    server = Server(
        (addr.strip("[]"), int(port)),
        args.alertmanager,
        args.credentials,
        args.admin_password_file,
        tls,
        args.connections,
        args.request_timeout,
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
