"""blockstack_http, the connection layer of the exporter, the metrics front and the page receiver:
a real server in this process on a free 127.0.0.1 port (stopped after, also on failure), real
sockets. The servers' own tests check the same on each of them (exporters/tests/test_hardening.py,
deploy/tests/test_metrics_front.py, alerts/tests/test_receiver.py)."""

import contextlib
import logging
import socket
import threading
import time

import pytest

import blockstack_http
from blockstack_testsupport.clock import seconds, wait_until


class Handler(blockstack_http.Handler):
    """GET /block waits until the test lets it go; any other GET answers its path. Every call is
    counted: a request that did not arrive whole, or a malformed one, must never get here."""

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self.server.calls.append(self.path)
        if self.path == "/block":
            self.server.release.wait(10)
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def serving(**options):
    server = blockstack_http.Server(("127.0.0.1", 0), Handler, **options)
    server.calls, server.release = [], threading.Event()
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield server, server.server_address[1]
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def wait_for(condition):
    """condition() true within 5 s (the tests' clock)."""
    return wait_until("the server's state", condition, 5, 0.01)


def test_a_whole_request_is_answered(http_abuse):
    with serving() as (server, port):
        answer = http_abuse.raw(
            port, b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nUser-Agent: Prometheus/2.42.0\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b"\r\n\r\n/metrics?x=1")
        assert server.calls == ["/metrics?x=1"]


MALFORMED = {
    "HTTP/0.9 (no version)": b"GET /metrics\r\n\r\n",
    "a control character in the query": b"GET /metrics?a=\x01 HTTP/1.1\r\n\r\n",
    "DEL in the path": b"GET /met\x7frics HTTP/1.1\r\n\r\n",
    "a tab in the target": b"GET /metrics\t HTTP/1.1\r\n\r\n",
    "non-ASCII in the target": "GET /métriques HTTP/1.1\r\n\r\n".encode(),
    "two spaces": b"GET  /metrics HTTP/1.1\r\n\r\n",
    "a fourth word": b"GET /metrics HTTP/1.1 x\r\n\r\n",
    "HTTP/2.0": b"GET /metrics HTTP/2.0\r\n\r\n",
    "a lower-case version": b"GET /metrics http/1.1\r\n\r\n",
    "garbage": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS ClientHello's start
    "a header without a colon": b"GET /metrics HTTP/1.1\r\nHost a\r\n\r\n",
    "a folded header": b"GET /metrics HTTP/1.1\r\nX-A: b\r\n c\r\n\r\n",
    "a space in a header name": b"GET /metrics HTTP/1.1\r\nX A: b\r\n\r\n",
    "NUL in a header value": b"GET /metrics HTTP/1.1\r\nX-A: b\x00c\r\n\r\n",
    "a bare CR in a header value": b"GET /metrics HTTP/1.1\r\nX-A: b\rc\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_request_gets_400_with_headers_and_reaches_no_handler(
    http_abuse, request_bytes, caplog
):
    with serving() as (server, port):
        answer = http_abuse.raw(port, request_bytes)
        assert answer.startswith(b"HTTP/1.0 400 ") and b"\r\nContent-Length: " in answer, answer[
            :200
        ]
        assert server.calls == []
        assert http_abuse.raw(port, b"GET /after HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200 "), (
            "no longer serving"
        )
        assert server.calls == ["/after"]
        assert "Traceback" not in caplog.text


def test_too_many_or_too_long_headers_get_431(http_abuse):
    with serving() as (server, port):
        many = b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * (blockstack_http.MAX_HEADERS + 1) + b"\r\n"
        long = b"GET / HTTP/1.1\r\nX-A: " + b"b" * blockstack_http.MAX_LINE + b"\r\n\r\n"
        for request_bytes in (many, long):
            assert http_abuse.raw(port, request_bytes).startswith(b"HTTP/1.0 431 ")
        assert server.calls == []


CUT = {
    "in the request line": b"GET /metrics HTT",
    "after the request line": b"GET /metrics HTTP/1.1\r\n",
    "in a header": b"GET /metrics HTTP/1.1\r\nHost: a",
    "before the empty line": b"GET /metrics HTTP/1.1\r\nHost: a\r\n",
}


@pytest.mark.parametrize("request_bytes", CUT.values(), ids=CUT.keys())
def test_a_request_cut_off_reaches_no_handler_and_gets_no_answer(http_abuse, request_bytes):
    with serving() as (server, port):
        assert http_abuse.raw(port, request_bytes, end=True) == b""
        assert server.calls == []


def test_a_trickled_request_is_closed_at_its_deadline(http_abuse):
    with serving(request_seconds=1) as (server, port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            start = time.monotonic()
            s.sendall(b"GET /metrics HTTP/1.1\r\n")

            def trickled_until_closed():  # a header byte every 0.1 s: each read quick, all late
                with contextlib.suppress(OSError):
                    s.sendall(b"X")
                return http_abuse.closed([s])

            wait_until("the trickled request closed", trickled_until_closed, 4, 0.1)
            assert 1 <= time.monotonic() - start < seconds(3.5)
        assert server.calls == []


def test_at_the_cap_the_oldest_incomplete_connection_makes_room(http_abuse):
    with serving(max_connections=3) as (server, port):
        held = http_abuse.hold(port, 3, heads=(b"GET /a HTTP/1.1\r\n",))
        wait_for(lambda: len(server._reading) == 3)
        assert http_abuse.raw(port, b"GET /new HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200 ")
        assert server.calls == ["/new"]
        wait_for(lambda: http_abuse.closed(held) == 1)
        assert http_abuse.closed(held[:1]) == 1, "not the oldest was closed"
        assert server.evicted == 1 and server.refused == 0


def test_a_whole_request_is_never_closed_for_another(http_abuse):
    """Two requests in their handler fill the cap: a third connection is closed at once, the
    two are answered; an incomplete one beside one whole request is the one to go."""
    with serving(max_connections=2) as (server, port):
        blocked = http_abuse.hold(port, 2, heads=(b"GET /block HTTP/1.0\r\n\r\n",))
        wait_for(lambda: server.calls == ["/block", "/block"])
        assert http_abuse.raw(port, b"GET /new HTTP/1.0\r\n\r\n") == b""
        assert server.refused == 1 and server.evicted == 0
        server.release.set()
        for s in blocked:
            assert s.recv(100).startswith(b"HTTP/1.0 200 ")
    with serving(max_connections=2) as (server, port):
        blocked = http_abuse.hold(port, 1, heads=(b"GET /block HTTP/1.0\r\n\r\n",))
        wait_for(lambda: server.calls == ["/block"])
        incomplete = http_abuse.hold(port, 1, heads=(b"GET /a HTTP/1.1\r\n",))
        wait_for(lambda: len(server._reading) == 1)
        assert http_abuse.raw(port, b"GET /new HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200 ")
        wait_for(lambda: http_abuse.closed(incomplete) == 1)
        server.release.set()
        assert blocked[0].recv(100).startswith(b"HTTP/1.0 200 ")


def test_1000_held_connections_do_not_delay_a_request(http_abuse):
    with serving(max_connections=500, request_seconds=30) as (server, port):
        held = http_abuse.hold(
            port, 1000, heads=(b"", b"GET /a HTTP/1.1\r\n", b"GET /a HTTP/1.1\r\nX-Slow: ")
        )
        http_abuse.wait_closed(
            held, 500
        )  # every held connection taken: 500 served, the 500 oldest closed for them
        p50, worst = http_abuse.timed(
            lambda: http_abuse.raw(port, b"GET /m HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200 ")
        )
        print(
            f"\n1,000 held connections, 500 served at most: a request p50 {p50 * 1000:.1f} ms, max {worst * 1000:.1f} ms"
        )
        assert worst < seconds(1), worst
        assert http_abuse.closed(held) <= 510, (
            "the held connections were not held"
        )  # each request took the place of one
        assert server.calls == ["/m"] * 10


class Failing(Handler):
    def do_GET(self):
        raise BrokenPipeError(32, "Broken pipe") if self.path == "/gone" else ValueError("a bug")


def test_a_client_fault_is_one_log_line_a_bug_keeps_its_traceback(http_abuse, caplog, capsys):
    server = blockstack_http.Server(("127.0.0.1", 0), Failing)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        with caplog.at_level(logging.WARNING, logger="blockstack_http"):
            http_abuse.raw(server.server_address[1], b"GET /gone HTTP/1.0\r\n\r\n")
            wait_for(lambda: caplog.records)
        assert [r.getMessage() for r in caplog.records] == [
            "127.0.0.1: connection ended: [Errno 32] Broken pipe"
        ]
        assert "Traceback" not in capsys.readouterr().err
        http_abuse.raw(server.server_address[1], b"GET /bug HTTP/1.0\r\n\r\n")
        wait_for(lambda: "ValueError: a bug" in capsys.readouterr().err or None)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_bad_limits_are_refused():
    for options in (
        {"max_connections": 0},
        {"request_seconds": 0},
        {"request_seconds": float("nan")},
    ):
        with pytest.raises(ValueError, match="must be positive"):
            blockstack_http.Server(("127.0.0.1", 0), Handler, **options)


@pytest.fixture(scope="module")
def tls_context(tmp_path_factory):
    """A server-side ssl.SSLContext with a self-signed certificate for 127.0.0.1, and its file."""
    import ssl
    import subprocess

    directory = tmp_path_factory.mktemp("tls")
    crt, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    return context, str(crt)


def tls_get(port, crt, path):
    import ssl

    client = ssl.create_default_context(cafile=crt)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        client.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        s.sendall(b"GET %s HTTP/1.0\r\n\r\n" % path)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer


def test_tls_the_handshake_in_the_connections_thread_within_its_time_and_the_cap(
    http_abuse, tls_context, monkeypatch
):
    """With tls: a request over TLS is answered; a connection that never handshakes is closed at the
    request deadline, and at the cap it is the one evicted (the wrapped socket is the one tracked)."""
    context, crt = tls_context
    monkeypatch.setattr(blockstack_http.Server, "tls", context)
    with serving(max_connections=2, request_seconds=1) as (server, port):
        assert tls_get(port, crt, b"/a").startswith(b"HTTP/1.0 200 ")
        assert server.calls == ["/a"]
        assert (
            http_abuse.raw(port, b"GET /plain HTTP/1.0\r\n\r\n") == b""
        )  # not TLS: closed, one log line
        silent = http_abuse.hold(
            port, 2, heads=(b"", b"\x16\x03\x01")
        )  # nothing; a ClientHello cut off
        wait_for(lambda: len(server._reading) == 2)
        assert tls_get(port, crt, b"/b").startswith(b"HTTP/1.0 200 ")
        assert server.evicted == 1 and server.calls == ["/a", "/b"]
        start = time.monotonic()
        http_abuse.wait_closed(silent, 2, seconds=5)
        assert time.monotonic() - start < seconds(2)
        wait_for(lambda: not server._open and not server._reading)
