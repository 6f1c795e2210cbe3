"""The fleet's alert gate: what an agent host's credential opens on the central side, and nothing
more. One gate stands in front of each central Alertmanager peer (roles.Central); the peer itself
listens on 127.0.0.1 only, behind the admin password.

    alert_gate.py --listen ADDR:PORT --alertmanager http://127.0.0.1:PORT
                  --credentials push-credentials.json --admin-password-file FILE [--tls-cert F --tls-key F]

A request is let through only when it is `POST /api/v2/alerts` (what Prometheus sends), with
`Content-Type: application/json`, basic auth of a host named in the credentials file (user = the
host, password = its push secret; the file holds sha256 of each secret: they are generated 144-bit
secrets, so a slow hash would buy nothing), and every alert in it labelled `host` = that host (a
host cannot raise, or resolve early, another host's alerts). The gate forwards it to its
Alertmanager with the admin password and relays the answer. Anything else: 401 without a valid
credential, 403 with one (silences, reads, other hosts' alerts), 415/413/400 for a bad body.
Alertmanager's own web config cannot restrict a user to one path, hence this program.

`GET /-/healthy` answers 200 without credentials (the gate's own health, nothing forwarded). The
credentials file is re-read when it changes: adding or revoking a host needs no restart. One thread
per connection with a 10 s socket timeout, so held connections do not delay a push. Standard
library only (it runs as a script under its own user).
"""
import argparse
import base64
import hashlib
import hmac
import http.server
import json
import os
import ssl
import sys
import threading
import urllib.error
import urllib.request

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
            user, _, password = base64.b64decode(authorization[6:], validate=True).decode().partition(":")
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


class Gate(http.server.BaseHTTPRequestHandler):
    server_version = "blockstack-alert-gate"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 10  # per connection: a client that sends nothing holds only its own thread

    def do_GET(self):
        if self.path == "/-/healthy":
            return self.answer(200, "OK\n")
        self.refuse()

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_GET

    def do_POST(self):
        host = self.refuse() if self.path != PUSH_PATH else self.authenticated()
        if host is None:
            return
        if self.headers.get_content_type() != "application/json":
            return self.answer(415, "application/json only\n")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self.answer(411, "Content-Length required\n")
        if not 0 <= length <= MAX_BODY:
            return self.answer(413, "too large\n")
        body = self.rfile.read(length)
        try:
            alerts = json.loads(body)
            foreign = {str(a.get("labels", {}).get("host")) for a in alerts} - {host}
        except (ValueError, AttributeError, TypeError):
            return self.answer(400, "expected a JSON list of alerts\n")
        if foreign:
            self.log_message("refused %s's push of alerts for %s", host, ", ".join(sorted(foreign)))
            return self.answer(403, f"{host} may push only alerts labelled host={host}\n")
        self.forward(body)

    def authenticated(self):
        host = self.server.credentials.host(self.headers.get("Authorization"))
        if host is None:
            self.answer(401, "unauthorized\n", {"WWW-Authenticate": 'Basic realm="blockstack alert gate"'})
        return host

    def refuse(self):
        """Anything but a push: 401 without a valid host credential, 403 with one."""
        self.drain()
        if self.authenticated() is not None:
            self.answer(403, f"only POST {PUSH_PATH}\n")

    def drain(self):
        try:
            length = min(int(self.headers.get("Content-Length", "0")), MAX_BODY)
        except ValueError:
            length = 0
        self.rfile.read(max(length, 0))

    def forward(self, body):
        req = urllib.request.Request(self.server.upstream + PUSH_PATH, data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": self.server.admin_authorization()})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                self.answer(r.status, r.read().decode(errors="replace"))
        except urllib.error.HTTPError as e:
            self.answer(e.code, e.read().decode(errors="replace"))
        except OSError as e:
            self.answer(502, f"alertmanager unreachable: {e}\n")

    def answer(self, status, text, headers=None):
        data = text.encode()
        self.send_response(status)
        for k, v in {"Content-Type": "text/plain; charset=utf-8", "Content-Length": str(len(data)),
                     **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_request(self, code="-", size="-"):
        if str(code) not in ("200", "202"):  # refusals and failures only
            super().log_request(code, size)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, upstream, credentials, admin_password_file, tls=None):
        super().__init__(address, Gate)
        self.upstream, self.credentials = upstream.rstrip("/"), Credentials(credentials)
        self.admin_password_file = admin_password_file
        self.tls = None
        if tls:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.minimum_version = ssl.TLSVersion.TLSv1_2
            self.tls.load_cert_chain(*tls)

    def finish_request(self, request, client_address):
        """In the connection's own thread: the TLS handshake too, so a silent client holds only it."""
        request.settimeout(Gate.timeout)
        if self.tls:
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                return
        try:
            super().finish_request(request, client_address)
        finally:
            if self.tls:
                request.close()

    def admin_authorization(self):
        with open(self.admin_password_file) as f:
            return "Basic " + base64.b64encode(f"admin:{f.read().strip()}".encode()).decode()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", required=True, metavar="ADDR:PORT")
    p.add_argument("--alertmanager", required=True, metavar="URL", help="the Alertmanager behind the gate")
    p.add_argument("--credentials", required=True, help="JSON {host: sha256 hex of its push secret}")
    p.add_argument("--admin-password-file", required=True, help="Alertmanager's admin password (user admin)")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    args = p.parse_args(argv)
    addr, _, port = args.listen.rpartition(":")
    tls = (args.tls_cert, args.tls_key) if args.tls_cert else None
    server = Server((addr.strip("[]"), int(port)), args.alertmanager, args.credentials, args.admin_password_file, tls)
    server.serve_forever()


if __name__ == "__main__":
    main()
