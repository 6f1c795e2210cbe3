"""/metrics of an exporter and nothing else on its TCP port: node_exporter and ebpf_exporter serve
Go's /debug/pprof/ (CPU profiles on demand, heap and goroutine dumps) to anyone who reaches them,
and neither has a flag to turn it off; ebpf_exporter has no web config for basic auth either. So
in `make up` each serves HTTP on a Unix socket in a directory only the front's group may enter,
and this front answers on the exporter's usual 127.0.0.1 port with `GET /metrics` (and `/`) only.

    metrics_front.py exec --socket PATH -- EXPORTER ARGS...
        bind a Unix socket at PATH and exec the exporter with it as systemd socket activation's
        fd 3 (LISTEN_FDS=1, LISTEN_PID = this pid, which exec keeps): ebpf_exporter takes it with
        --web.listen-address=fd://0, node_exporter with --web.systemd-socket. Nothing of Python
        stays running; the exporter keeps its own user and capabilities.
    metrics_front.py serve --route ADDR:PORT=PATH ... [--connections N] [--request-timeout S]
        one listener per route; GET /metrics?... and GET / are forwarded to the socket (with
        Accept, Accept-Encoding and User-Agent only), anything else is answered 404 here.

The connections are httpd/blockstack_http.py's (its docstring says what they get): the request
line and headers must arrive whole within --request-timeout seconds (10); 400 for a malformed
request line, target or header, no HTTP/0.9; at most --connections per route (1,024), the one
sending its request the longest closed for a new one, so held connections never stop the accept
loop; a listen backlog of 4,096. Nothing is forwarded for a request that did not arrive whole or
whose client already closed. The exporter's answer (30 s at most) is passed on; 502 if it cannot
be had, one log line.

Standard library only (blockstack_http is too; it runs as a script under its own user).
"""

import argparse
import http.client
import os
import socket
import sys
import threading

import blockstack_http

FD = 3  # systemd's SD_LISTEN_FDS_START
PATHS = ("/metrics", "/")
REQUEST_SECONDS = 10.0  # for the request line and headers; Prometheus sends them in one go
EXPORTER_SECONDS = (
    30.0  # for the exporter's answer (a scrape of node_exporter takes well under 1 s)
)


def exec_with_socket(path, argv):
    sock = blockstack_http.unix_listener(path, 64)  # in a directory only the front's group enters
    if sock.fileno() != FD:
        os.dup2(sock.fileno(), FD)
    os.set_inheritable(FD, True)  # a socket is close-on-exec, and dup2 onto itself changes nothing
    env = dict(os.environ, LISTEN_FDS="1", LISTEN_PID=str(os.getpid()), LISTEN_FDNAMES="metrics")
    os.execve(argv[0], argv, env)


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Front(blockstack_http.Handler):
    server_version = "blockstack-metrics-front"
    sys_version = ""

    def do_GET(self):
        if self.path.split("?", 1)[0] not in PATHS:
            return self.reply(404, b"only /metrics\n")
        if self.client_gone():  # an aborted request: nobody to scrape the exporter for
            return
        conn = UnixConnection(self.server.socket_path, timeout=EXPORTER_SECONDS)
        try:
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() in ("accept", "accept-encoding", "user-agent")
            }
            conn.request("GET", self.path, headers=headers)
            r = conn.getresponse()
            body = r.read()
        except (OSError, http.client.HTTPException) as e:
            return self.reply(502, f"exporter unreachable: {e}\n")
        finally:
            conn.close()
        encoding = r.getheader("Content-Encoding")
        self.reply(
            r.status,
            body,
            r.getheader("Content-Type", "text/plain"),
            [("Content-Encoding", encoding)] if encoding else (),
        )

    def do_other(self):
        self.reply(404, b"only GET /metrics\n")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_other

    def log_request(self, code="-", size="-"):
        if str(code) != "200":
            super().log_request(code, size)


class Server(blockstack_http.Server):
    def __init__(
        self,
        address,
        socket_path,
        max_connections=blockstack_http.MAX_CONNECTIONS,
        request_seconds=REQUEST_SECONDS,
    ):
        super().__init__(address, Front, max_connections, request_seconds)
        self.socket_path = socket_path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exec"]:
        p = argparse.ArgumentParser(prog="metrics_front.py exec")
        p.add_argument("--socket", required=True)
        p.add_argument("command", nargs=argparse.REMAINDER)
        args = p.parse_args(argv[1:])
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return exec_with_socket(args.socket, command)
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("mode", choices=["serve"])
    p.add_argument("--route", action="append", required=True, metavar="ADDR:PORT=SOCKET")
    p.add_argument(
        "--connections",
        type=int,
        default=blockstack_http.MAX_CONNECTIONS,
        help="connections served at once per route (default %(default)s)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=REQUEST_SECONDS,
        help="seconds for a request line and headers to arrive (default %(default)s)",
    )
    args = p.parse_args(argv)
    threading.stack_size(256 << 10)  # a thread per connection: 1,024 held ones stay small
    servers = []
    for route in args.route:
        listen, _, path = route.partition("=")
        addr, _, port = listen.rpartition(":")
        if not (addr and path and port.isdigit()):
            p.error(f"--route {route}: not ADDR:PORT=SOCKET")
        try:
            servers.append(
                Server((addr.strip("[]"), int(port)), path, args.connections, args.request_timeout)
            )
        except ValueError as e:  # --connections or --request-timeout not positive
            p.error(str(e))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
