"""metrics_front.py serve, the real process on a free 127.0.0.1 port (stopped after, also on
failure), in front of a stand-in exporter on a Unix socket in this process that counts what
reaches it. What they guard against, each seen in a front without blockstack_http: 20 of 20
trickling connections held open, 12-13 of 100 concurrent connects timed out (a listen backlog of
5), aborted partial requests forwarded as whole scrapes, a control character in the query dropping
the connection on an uncaught exception, HTTP/0.9 answered with a bare body."""

import contextlib
import http.server
import os
import socketserver
import sys
import threading
import time

import pytest

from blockstack_deploy import metrics_front
from blockstack_testsupport import procs
from blockstack_testsupport.clock import seconds

pytestmark = pytest.mark.servers

BODY = b"# TYPE up gauge\nup 1\n"


class StandIn(http.server.BaseHTTPRequestHandler):
    """The exporter behind the front: answers BODY to any GET and records its path."""

    def do_GET(self):
        self.server.paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def address_string(self):
        return "unix"

    def log_message(self, format, *args):
        pass


@contextlib.contextmanager
def front(tmp_path, *args):
    """The front on a free port before a stand-in exporter: yields (port, the paths forwarded to
    the stand-in since the front answered its health check, the front's log path)."""
    sock = str(tmp_path / "metrics.sock")
    exporter = socketserver.ThreadingUnixStreamServer(sock, StandIn)
    exporter.daemon_threads, exporter.paths = True, []
    thread = threading.Thread(
        target=exporter.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    port, log = procs.free_port(), tmp_path / "front.log"
    argv = [
        sys.executable,
        metrics_front.__file__,
        "serve",
        f"--route=127.0.0.1:{port}={sock}",
        *args,
    ]
    try:
        with procs.running(argv, health_url=f"http://127.0.0.1:{port}/metrics", log_path=str(log)):
            del exporter.paths[:]  # the health checks
            yield port, exporter.paths, log
    finally:
        exporter.shutdown()
        exporter.server_close()
        thread.join(10)
        os.unlink(sock)


def scrape(http_abuse, port, path="/metrics"):
    return http_abuse.raw(
        port, b"GET %s HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n" % path.encode()
    )


def test_metrics_are_forwarded_and_nothing_else(tmp_path, http_abuse):
    with front(tmp_path) as (port, paths, log):
        answer = scrape(http_abuse, port, "/metrics?collect[]=diskstats")
        assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b"\r\n\r\n" + BODY)
        assert scrape(http_abuse, port, "/debug/pprof/heap").startswith(b"HTTP/1.0 404 ")
        assert http_abuse.raw(
            port, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        ).startswith(b"HTTP/1.0 404 ")
        assert paths == ["/metrics?collect[]=diskstats"]


MALFORMED = {
    "a bad request line": b"GET /metrics HTTP/1.1 x\r\n\r\n",
    "a control character in the query": b"GET /metrics?x=\x01 HTTP/1.1\r\n\r\n",
    "non-ASCII in the query": "GET /metrics?x=é HTTP/1.1\r\n\r\n".encode(),
    "HTTP/0.9": b"GET /metrics\r\n\r\n",
    "a bad header": b"GET /metrics HTTP/1.1\r\nAccept text/plain\r\n\r\n",
}
CUT = {
    "in the request line": b"GET /metr",
    "after the request line": b"GET /metrics HTTP/1.1\r\n",
    "in the headers": b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: te",
}


def test_malformed_and_cut_off_requests_are_not_forwarded(tmp_path, http_abuse):
    with front(tmp_path) as (port, paths, log):
        for what, request_bytes in MALFORMED.items():
            assert http_abuse.raw(port, request_bytes).startswith(b"HTTP/1.0 400 "), what
        for what, request_bytes in CUT.items():
            assert http_abuse.raw(port, request_bytes, end=True) == b"", what
        assert paths == []
        assert scrape(http_abuse, port).startswith(b"HTTP/1.0 200 ") and paths == ["/metrics"]
        assert "Traceback" not in log.read_text()


def test_trickling_connections_are_closed_at_the_request_timeout(tmp_path, http_abuse):
    with front(tmp_path, "--request-timeout=2") as (port, paths, log):
        trickling = http_abuse.hold(port, 20, heads=(b"GET /metrics HTTP/1.1\r\n",))

        def trickled_until_closed():  # a header byte every 0.2 s on each: every read is quick
            for s in trickling:
                with contextlib.suppress(OSError):
                    s.send(b"X")
            return http_abuse.closed(trickling) == 20

        procs.wait_until("the 20 trickling connections closed", trickled_until_closed, 5, 0.2)
        assert paths == []


def test_1000_held_connections_do_not_delay_a_scrape(tmp_path, http_abuse):
    with front(tmp_path, "--connections=500", "--request-timeout=30") as (port, paths, log):
        start = time.monotonic()
        held = http_abuse.hold(
            port,
            1000,
            heads=(b"", b"GET /metrics HTTP/1.1\r\n", b"GET /metrics HTTP/1.1\r\nX-Slow: "),
        )
        connected = time.monotonic() - start
        http_abuse.wait_closed(
            held, 500
        )  # every held connection taken: 500 served, the 500 oldest closed for them
        p50, worst = http_abuse.timed(lambda: scrape(http_abuse, port).startswith(b"HTTP/1.0 200 "))
        print(
            f"\nfront, 1,000 held connections (500 served at most, connected in {connected:.2f} s): "
            f"scrape p50 {p50 * 1000:.0f} ms, max {worst * 1000:.0f} ms"
        )
        assert connected < seconds(5), (
            "connects waited for SYN retries: the listen backlog overflowed"
        )
        assert worst < seconds(1), worst
        assert http_abuse.closed(held) <= 510, (
            "the held connections were not held"
        )  # each request took the place of one
        assert paths == ["/metrics"] * 10
        assert "Traceback" not in log.read_text()
