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
    metrics_front.py serve --route ADDR:PORT=PATH ...
        one listener per route, a thread per connection (10 s timeout); GET /metrics?... and GET /
        are forwarded to the socket, anything else is answered 404 here.

Standard library only (it runs as a script under its own user).
"""
import argparse
import http.client
import http.server
import os
import socket
import sys
import threading

FD = 3  # systemd's SD_LISTEN_FDS_START
PATHS = ("/metrics", "/")


def exec_with_socket(path, argv):
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o666)  # who may connect is the directory's business (0750, the front's group)
    sock.listen(64)
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


class Front(http.server.BaseHTTPRequestHandler):
    server_version = "blockstack-metrics-front"
    sys_version = ""
    timeout = 10

    def do_GET(self):
        if self.path.split("?", 1)[0] not in PATHS:
            return self.answer(404, b"only /metrics\n", "text/plain; charset=utf-8")
        conn = UnixConnection(self.server.socket_path, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "accept-encoding", "user-agent")}
            conn.request("GET", self.path, headers=headers)
            r = conn.getresponse()
            body = r.read()
            self.answer(r.status, body, r.getheader("Content-Type", "text/plain"), r.getheader("Content-Encoding"))
        except OSError as e:
            self.answer(502, f"exporter unreachable: {e}\n".encode(), "text/plain; charset=utf-8")
        finally:
            conn.close()

    def do_other(self):
        self.answer(404, b"only GET /metrics\n", "text/plain; charset=utf-8")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_other

    def answer(self, status, body, content_type, encoding=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_request(self, code="-", size="-"):
        if str(code) != "200":
            super().log_request(code, size)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, socket_path):
        super().__init__(address, Front)
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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["serve"])
    p.add_argument("--route", action="append", required=True, metavar="ADDR:PORT=SOCKET")
    args = p.parse_args(argv)
    servers = []
    for route in args.route:
        listen, _, path = route.partition("=")
        addr, _, port = listen.rpartition(":")
        servers.append(Server((addr, int(port)), path))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
