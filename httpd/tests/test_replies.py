"""blockstack_http's one reply and one body reader (Handler.reply, Handler.read_body), the rules
every server of the project answers by: a real server in this process on a free 127.0.0.1 port,
raw requests on real sockets."""

import threading
import time

import pytest

import blockstack_http
from blockstack_testsupport.clock import seconds

LIMIT = 100  # the handler's max_body


class Echo(blockstack_http.Handler):
    """GET answers a fixed text with a header of its own; POST takes a JSON body, PUT a body of any
    type, and echoes it. Every body handed over, or None for one refused, is kept in the server."""

    body_methods = ("POST", "PUT")
    max_body = LIMIT

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self.reply(200, "grüße\n", headers=[("X-Echo", "1")])

    do_HEAD = do_GET

    def do_POST(self, content_type="application/json"):
        try:
            body = self.read_body(content_type)
        except blockstack_http.Refused as refused:
            self.server.bodies.append(None)
            return self.reply(refused.status, refused.reason)
        self.server.bodies.append(bytes(body))
        self.reply(200, body, "application/octet-stream")

    def do_PUT(self):
        self.do_POST(content_type=None)


@pytest.fixture
def server():
    with blockstack_http.Server(("127.0.0.1", 0), Echo, request_seconds=1) as server:
        server.bodies = []
        server.port = server.server_address[1]
        serving = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        serving.start()
        yield server
        server.shutdown()
        serving.join(10)


def answer(http_abuse, server, request_bytes, **options):
    """(status, {header: value}, body) of the server's answer to request_bytes."""
    head, _, body = http_abuse.raw(server.port, request_bytes, **options).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


def post(headers, body=b"", method=b"POST"):
    return (
        method
        + b" /x HTTP/1.1\r\nHost: a\r\n"
        + b"".join(h + b"\r\n" for h in headers)
        + b"\r\n"
        + body
    )


JSON = b"Content-Type: application/json"


def test_a_reply_carries_its_type_length_and_headers_and_no_body_to_a_head(http_abuse, server):
    status, headers, body = answer(http_abuse, server, b"GET / HTTP/1.1\r\n\r\n")
    assert (status, body) == (200, "grüße\n".encode())
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert headers["Content-Length"] == str(len(body)) == "8"
    assert headers["X-Echo"] == "1"
    assert answer(http_abuse, server, b"HEAD / HTTP/1.1\r\n\r\n") == (200, headers, b"")


CONTENT_LENGTH = {  # Content-Length header (None: none) and body sent -> status
    "none": (None, b"{}", 411),
    "not digits": (b"x", b"{}", 400),
    "negative": (b"-1", b"{}", 400),
    "a sign": (b"+2", b"{}", 400),
    "empty": (b"", b"{}", 400),
    "past the limit": (b"%d" % (LIMIT + 1), b"[" + b" " * (LIMIT - 1) + b"]", 413),
    "far past the limit, the body sent": (b"%d" % (1 << 20), b"0" * (1 << 20), 413),
    "at the limit": (b"%d" % LIMIT, b"[" + b" " * (LIMIT - 2) + b"]", 200),
    "zero": (b"0", b"", 200),
}


@pytest.mark.parametrize("length, body, status", CONTENT_LENGTH.values(), ids=CONTENT_LENGTH.keys())
def test_each_content_length_gets_its_answer(http_abuse, server, length, body, status):
    headers = [JSON] + ([b"Content-Length: " + length] if length is not None else [])
    got, answer_headers, answer_body = answer(http_abuse, server, post(headers, body))
    assert got == status, answer_body
    assert answer_headers["Content-Length"] == str(len(answer_body))
    if status == 200:
        assert server.bodies == [body] and answer_body == body
    else:
        assert server.bodies == [None] and answer_body.strip(), "every refusal says why"


def test_a_body_cut_short_is_400_and_a_late_one_408_neither_handed_over(http_abuse, server):
    cut = post([JSON, b"Content-Length: 10"], b"[1, 2")
    assert answer(http_abuse, server, cut, end=True)[0] == 400
    start = time.monotonic()
    assert (
        answer(http_abuse, server, cut)[0] == 408
    )  # the client waits: the request's time runs out
    assert 1 <= time.monotonic() - start < seconds(3)
    assert server.bodies == [None, None]


CONTENT_TYPE = {  # Content-Type header (None: none), method -> status
    "JSON": (b"application/json", b"POST", 200),
    "JSON with a charset, in capitals": (b"Application/JSON; charset=utf-8", b"POST", 200),
    "text": (b"text/plain", b"POST", 415),
    "a form": (b"application/x-www-form-urlencoded", b"POST", 415),
    "none": (None, b"POST", 415),
    "text where no type is asked": (b"text/plain", b"PUT", 200),
}


@pytest.mark.parametrize(
    "content_type, method, status", CONTENT_TYPE.values(), ids=CONTENT_TYPE.keys()
)
def test_the_content_type_asked_for_is_checked(http_abuse, server, content_type, method, status):
    headers = [b"Content-Length: 2"] + ([b"Content-Type: " + content_type] if content_type else [])
    assert answer(http_abuse, server, post(headers, b"{}", method))[0] == status
    assert server.bodies == [b"{}" if status == 200 else None]
