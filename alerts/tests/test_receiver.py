"""The page receiver (alerts/receiver/page_receiver.py) under abuse: a full disk, non-standard and
malformed JSON, 500 concurrent notifications, 8 MiB bodies, trickled requests. Each test starts
the real receiver process on a free 127.0.0.1 port and stops it after (also on failure), and
checks that the pages file's earlier bytes are exactly as they were and every line is whole JSON.
"""

import contextlib
import json
import os
import pathlib
import re
import subprocess
import threading
import time
import urllib.error

import abuse  # alerts/tests/abuse.py: the clients of the abuse benchmark
import pytest

import page_receiver  # for its limits only: every test talks to the process
from blockstack_lab import loop
from blockstack_testsupport import procs
from blockstack_testsupport.clock import seconds

pytestmark = [pytest.mark.root]


def records(out):
    """Every line of the pages file, each decoded on its own (a cut or glued line fails here)."""
    data = out.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


@contextlib.contextmanager
def receiver_with_a_page(directory, *args, log_dir=None):
    """A receiver writing directory/pages.jsonl, one page already written: yields (port, process,
    the file, its bytes after that page)."""
    out = pathlib.Path(directory) / "pages.jsonl"
    log = pathlib.Path(log_dir or directory) / "receiver.log"
    with abuse.receiver(out, *args, log_path=log) as (port, proc):
        assert abuse.post(port, abuse.notification(alertname="First"))[0] == 200
        earlier = out.read_bytes()
        assert [r["notification"]["alerts"][0]["labels"]["alertname"] for r in records(out)] == [
            "First"
        ]
        yield port, proc, out, earlier


def assert_appended(out, earlier, count):
    """The file is `earlier` unchanged plus `count` whole lines."""
    data = out.read_bytes()
    assert data[: len(earlier)] == earlier, "an earlier line changed"
    assert len(records(out)) == len(earlier.splitlines()) + count


def test_a_notification_becomes_one_line_and_only_webhook_posts_are_taken(tmp_path):
    with receiver_with_a_page(tmp_path) as (port, proc, out, earlier):
        body = abuse.notification(status="resolved")
        assert abuse.post(port, body, path="/ticket") == (200, b"ok\n")
        for method, path in (("GET", "/"), ("GET", "/healthz")):
            assert abuse.post(port, None, path=path, method=method) == (200, b"ok\n")
        refused = {
            (method, path): abuse.post(port, body, path=path, method=method)[0]
            for method, path in (
                ("POST", "/"),
                ("POST", "/other"),
                ("GET", "/page"),
                ("PUT", "/page"),
                ("DELETE", "/page"),
            )
        }
        assert refused == {
            ("POST", "/"): 404,
            ("POST", "/other"): 404,
            ("GET", "/page"): 404,
            ("PUT", "/page"): 501,
            ("DELETE", "/page"): 501,
        }
        assert_appended(out, earlier, 1)
        last = records(out)[-1]
        assert last["notification"] == json.loads(body) and last["path"] == "/ticket"
        assert abs(last["received_at"] - time.time()) < 60


def test_a_full_disk_answers_503_and_leaves_no_partial_line(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("not root: this test mounts a 64 KiB tmpfs (sudo make test)")
    with (
        loop.mounted("tmpfs", "size=64k", fstype="tmpfs", directory=tmp_path) as mnt,
        receiver_with_a_page(mnt, log_dir=tmp_path) as (port, proc, out, earlier),
    ):
        filler = pathlib.Path(abuse.fill(mnt, 64 << 10))
        # 16 KiB: the first ~3 KiB fit in the pages file's last 4 KiB page, the rest does not.
        assert abuse.post(port, abuse.notification(size=16 << 10))[0] == 503
        assert out.read_bytes() == earlier
        log = (tmp_path / "receiver.log").read_text()
        assert re.search(r"wrote [1-9][0-9]* of 16[0-9]{3} bytes", log), (
            "no partial write was undone:\n" + log
        )
        filler.unlink()
        big = abuse.notification(size=16 << 10)
        assert abuse.post(port, big)[0] == 200, "the retry of the page after space was freed"
        assert_appended(out, earlier, 1)
        assert records(out)[-1]["notification"] == json.loads(big)


def test_a_cut_last_line_is_kept_and_the_next_page_starts_a_line_of_its_own(tmp_path):
    out = tmp_path / "pages.jsonl"
    earlier = b'{"notification": {}, "path": "/page", "received_at": 1}\n{"notification": {"rec'
    out.write_bytes(earlier)  # a crash (power loss) cut the last line
    with abuse.receiver(out, log_path=tmp_path / "receiver.log") as (port, proc):
        body = abuse.notification()
        assert abuse.post(port, body)[0] == 200
    data = out.read_bytes()
    assert data.startswith(earlier + b"\n")
    assert json.loads(data.splitlines()[-1])["notification"] == json.loads(body)


BAD_BODIES = {
    "NaN": b'{"receiver": "page", "status": "firing", "alerts": [], "x": NaN}',
    "Infinity": b'{"receiver": "page", "status": "firing", "alerts": [], "x": Infinity}',
    "-Infinity": b'{"receiver": "page", "status": "firing", "alerts": [], "x": -Infinity}',
    "a float that overflows": b'{"receiver": "page", "status": "firing", "alerts": [], "x": 1e400}',
    "an integer of 5000 digits": b'{"receiver": "page", "status": "firing", "alerts": [], "x": 1'
    + b"0" * 5000
    + b"}",
    "100000 nested lists": b"[" * 100000 + b"]" * 100000,
    "50000 nested objects inside a notification": b'{"receiver": "page", "status": "firing", "alerts": [], "x": '
    + b'{"a": ' * 50000
    + b"1"
    + b"}" * 50000
    + b"}",
    "not JSON": b"not json",
    "not UTF-8": b'{"receiver": "\xff\xfe", "status": "firing", "alerts": []}',
    "empty": b"",
    "a list": b"[]",
    "a string": b'"page"',
    "no alerts": b'{"receiver": "page", "status": "firing"}',
    "alerts not a list": b'{"receiver": "page", "status": "firing", "alerts": {}}',
    "receiver not a string": b'{"receiver": 1, "status": "firing", "alerts": []}',
    "an alert without labels": b'{"receiver": "page", "status": "firing", "alerts": [{"status": "firing"}]}',
    "a label not a string": b'{"receiver": "page", "status": "firing", "alerts": '
    b'[{"status": "firing", "labels": {"device": 0}}]}',
}


def test_non_standard_deeply_nested_and_malformed_bodies_are_answered_400(tmp_path):
    with receiver_with_a_page(tmp_path) as (port, proc, out, earlier):
        answers = {what: abuse.post(port, body) for what, body in BAD_BODIES.items()}
        answers["Content-Length -1"] = abuse.post(port, b"{}", headers={"Content-Length": "-1"})
        answers["Content-Length x"] = abuse.post(port, b"{}", headers={"Content-Length": "x"})
        assert {what: status for what, (status, _) in answers.items()} == {
            what: 400 for what in answers
        }
        assert all(answer.strip() for _, answer in answers.values()), "every 400 says why"
        assert out.read_bytes() == earlier
        assert abuse.post(port, abuse.notification())[0] == 200, "still serving"
        assert_appended(out, earlier, 1)


def test_500_concurrent_notifications_are_all_answered_and_written(tmp_path):
    with receiver_with_a_page(tmp_path) as (port, proc, out, earlier):
        listening = subprocess.run(
            ["ss", "-Hltn", f"sport = :{port}"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.split()
        assert int(listening[2]) >= 128, (
            f"listen backlog {listening[2]}"
        )  # State Recv-Q Send-Q(backlog) ...
        got = abuse.concurrently(port, [abuse.notification()] * 500)
        assert got == {200: 500}
        assert_appended(out, earlier, 500)


def test_big_bodies_are_refused_and_memory_stays_bounded(tmp_path):
    with receiver_with_a_page(tmp_path) as (port, proc, out, earlier):
        limit = page_receiver.MAX_BODY
        assert abuse.post(port, abuse.notification(limit + 1))[0] == 413
        got = abuse.concurrently(port, [abuse.notification(8 << 20)] * 10)
        assert got == {413: 10}
        assert out.read_bytes() == earlier
        got = abuse.concurrently(port, [abuse.notification(limit)] * 32)
        assert got == {200: 32}
        assert_appended(out, earlier, 32)
        peak = abuse.peak_rss(proc.pid)
        # 32 bodies of 1 MiB held at once and one decoded: ~70 MiB measured; 8 MiB bodies add nothing.
        assert peak < 128 << 20, f"peak RSS {peak >> 20} MiB"


def test_trickled_requests_are_dropped_and_pages_still_get_through(tmp_path):
    with receiver_with_a_page(tmp_path, "--request-timeout=3") as (port, proc, out, earlier):
        results = {}

        def hold(what, head):
            results[what] = abuse.trickle(port, head, interval=0.1, limit=seconds(10))

        holders = [
            threading.Thread(target=hold, args=("body", abuse.BODY_HEAD)),
            threading.Thread(target=hold, args=("headers", b"POST /page HTTP/1.1\r\nX-Slow: ")),
        ]
        for t in holders:
            t.start()
        assert abuse.post(port, abuse.notification())[0] == 200
        assert not results, "the page waited until the trickled requests were dropped"
        for t in holders:
            t.join(seconds(15))
        (body_seconds, body_answer), (header_seconds, _) = results["body"], results["headers"]
        # Each is dropped 3 s after its worker took it: not before, and not much after.
        assert body_seconds is not None and 3 <= body_seconds < seconds(6), body_seconds
        assert body_answer.startswith(b"HTTP/1.0 408 ")
        assert header_seconds is not None and 3 <= header_seconds < seconds(6), header_seconds
        assert_appended(out, earlier, 1)


def test_idle_connections_do_not_delay_a_page(tmp_path):
    """200 connections that send a request line and then nothing: before, they took all 32
    workers for their 10 s each and a page waited 59.8 s; now they hold threads, not workers."""
    with receiver_with_a_page(tmp_path) as (port, proc, out, earlier), abuse.held(port, 200):
        procs.wait_until(
            "a thread of the receiver for each held connection",
            lambda: len(os.listdir(f"/proc/{proc.pid}/task")) > 200,
            10,
            0.05,
        )
        start = time.monotonic()
        assert abuse.post(port, abuse.notification(), timeout=60)[0] == 200
        waited = time.monotonic() - start
        print(f"\na page while 200 connections are held: {waited:.2f} s")
        assert waited < seconds(2), waited
        assert_appended(out, earlier, 1)


def test_a_post_without_the_token_or_as_text_is_refused(tmp_path):
    """A web page on this host can POST text/plain cross-origin without a preflight, but can set
    neither an Authorization header nor a JSON content type without one."""
    with receiver_with_a_page(tmp_path) as (port, proc, out, earlier):
        body = abuse.notification()
        origin = {"Origin": "http://evil.example"}
        answers = {
            "no token": abuse.post(port, body, headers={**origin, "Authorization": ""})[0],
            "wrong token": abuse.post(
                port, body, headers={**origin, "Authorization": "Bearer wrong"}
            )[0],
            "basic auth": abuse.post(port, body, headers={"Authorization": "Basic " + abuse.TOKEN})[
                0
            ],
            "text/plain with the token": abuse.post(
                port, body, headers={**origin, "Content-Type": "text/plain"}
            )[0],
            "form with the token": abuse.post(
                port, body, headers={"Content-Type": "application/x-www-form-urlencoded"}
            )[0],
            "no content type": abuse.post(port, body, headers={"Content-Type": ""})[0],
            "watchdog without the token": abuse.post(
                port, body, path="/watchdog", headers={"Authorization": ""}
            )[0],
        }
        assert answers == {
            "no token": 401,
            "wrong token": 401,
            "basic auth": 401,
            "text/plain with the token": 415,
            "form with the token": 415,
            "no content type": 415,
            "watchdog without the token": 401,
        }
        assert out.read_bytes() == earlier
        assert (
            abuse.post(port, body, headers={"Content-Type": "application/json; charset=utf-8"})[0]
            == 200
        )
        assert_appended(out, earlier, 1)


def metric(port, name):
    text = abuse.post(port, None, path="/metrics", method="GET")[1].decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name)
    }


def test_metrics_tell_what_was_answered(tmp_path):
    with receiver_with_a_page(tmp_path, f"--statfs={tmp_path}") as (port, proc, out, earlier):
        assert abuse.post(port, b"x")[0] == 400
        assert metric(port, "blockstack_receiver_requests_total") == {
            'blockstack_receiver_requests_total{path="/page",code="200"}': 1,
            'blockstack_receiver_requests_total{path="/page",code="400"}': 1,
        }
        avail = metric(port, "blockstack_receiver_filesystem_avail_bytes")
        assert avail[f'blockstack_receiver_filesystem_avail_bytes{{path="{tmp_path}"}}'] > 0
        assert metric(port, "blockstack_receiver_write_errors_total") == {
            "blockstack_receiver_write_errors_total": 0
        }
        assert (
            metric(port, "process_start_time_seconds")["process_start_time_seconds"] <= time.time()
        )


def test_the_watchdog_is_a_durable_heartbeat_that_pings_the_switch_only_once_written(tmp_path):
    """/watchdog is written as a page is (fsynced, to a new heartbeat.jsonl beside the pages file,
    not in it); only then do its time in /metrics and a ping of the dead man's switch follow. On a
    full disk: 503, a write error, no ping, and the stand-in switch pages after its timeout;
    space freed, the next heartbeat resolves it."""
    if os.geteuid() != 0:
        pytest.fail("not root: this test mounts a 64 KiB tmpfs (sudo make test)")
    watchdog = abuse.notification(alertname="BlockStackWatchdog")
    with (
        abuse.dead_mans_switch(tmp_path / "switch", timeout=3) as (
            url,
            url_file,
            switch_port,
            events,
        ),
        loop.mounted("tmpfs", "size=64k", fstype="tmpfs", directory=tmp_path) as mnt,
        receiver_with_a_page(mnt, f"--heartbeat-url-file={url_file}", log_dir=tmp_path) as (
            port,
            proc,
            out,
            earlier,
        ),
    ):
        before = time.time()
        assert abuse.post(port, watchdog, path="/watchdog")[0] == 200
        assert out.read_bytes() == earlier, "the heartbeat went into the pages file"
        heartbeat = pathlib.Path(mnt) / page_receiver.HEARTBEAT_FILE
        assert [r["notification"] for r in records(heartbeat)] == [json.loads(watchdog)]
        assert (
            metric(port, "blockstack_receiver_watchdog_last_seconds")[
                "blockstack_receiver_watchdog_last_seconds"
            ]
            >= before
        )
        pinged = {
            'blockstack_receiver_heartbeat_pings_total{result="ok"}': 1.0,
            'blockstack_receiver_heartbeat_pings_total{result="failed"}': 0.0,
        }
        procs.wait_until(
            "the ping",
            lambda: metric(port, "blockstack_receiver_heartbeat_pings_total") == pinged,
            10,
            0.1,
        )
        assert abuse.switch_status(switch_port)["pings"] == 1
        with pytest.raises(
            urllib.error.HTTPError, match="404"
        ):  # the token is the ping URL's secret
            procs.http_get(url[:-1] + ("0" if url[-1] != "0" else "1"))
        assert abuse.switch_status(switch_port)["pings"] == 1

        assert (
            abuse.post(port, watchdog, path="/watchdog")[0] == 200
        )  # a second: the first's block is free again
        filler = pathlib.Path(abuse.fill(mnt, 64 << 10))
        last = metric(port, "blockstack_receiver_watchdog_last_seconds")
        for _ in range(3):  # not once: each would free the block of the one before
            assert abuse.post(port, watchdog, path="/watchdog")[0] == 503
        assert metric(port, "blockstack_receiver_write_errors_total") == {
            "blockstack_receiver_write_errors_total": 3
        }
        assert metric(port, "blockstack_receiver_watchdog_last_seconds") == last
        down = procs.wait_until("the switch's page", lambda: abuse.switch_events(events), 10, 0.2)
        assert [e["state"] for e in down] == ["down"] and down[0]["silent_seconds"] >= 3
        assert abuse.switch_status(switch_port)["pings"] == 2, "pinged without a heartbeat written"

        filler.unlink()
        assert abuse.post(port, watchdog, path="/watchdog")[0] == 200
        procs.wait_until(
            "the switch's resolve", lambda: len(abuse.switch_events(events)) == 2, 10, 0.2
        )
        assert [e["state"] for e in abuse.switch_events(events)] == ["down", "up"]
        assert (
            len(records(heartbeat)) == 1 and not pathlib.Path(f"{heartbeat}.new").exists()
        )  # replaced at every write
        assert out.read_bytes() == earlier


def test_the_file_is_rotated_and_no_notification_is_lost(tmp_path):
    """64 notifications of ~1 KiB into a file rotated before it passes 8 KiB: every file whole
    lines and no larger, and received() reads every notification back in order."""
    from page_receiver import received

    with receiver_with_a_page(tmp_path, "--max-bytes=8192", "--backups=20") as (
        port,
        proc,
        out,
        earlier,
    ):
        bodies = [abuse.notification(alertname=f"N{i}") for i in range(64)]
        for body in bodies:
            assert abuse.post(port, body)[0] == 200
        files = sorted(tmp_path.glob("pages.jsonl*"))
        assert len(files) > 5
        for f in files:
            assert f.stat().st_size <= 8192
            records(f)  # whole lines only
        names = [a["labels"]["alertname"] for _, a in received(str(out))]
        assert names == ["First"] + [f"N{i}" for i in range(64)]


MALFORMED = {
    "a bad request line": b"POST /page HTTP/1.1 x\r\n\r\n",
    "a control character in the path": b"POST /pa\x00ge HTTP/1.1\r\n\r\n",
    "HTTP/0.9": b"GET /healthz\r\n\r\n",
    "a bad header": abuse.BODY_HEAD.replace(b"Host: x", b"Host x"),
}


@pytest.mark.servers
def test_malformed_and_cut_off_requests_write_nothing_and_the_receiver_keeps_serving(
    tmp_path, http_abuse
):
    """An HTTP/0.9 request and a bad request line get a 400 with a status line and headers (not a
    bare body); a request cut off anywhere writes nothing; a whole one after them is written."""
    body = abuse.notification()
    with receiver_with_a_page(tmp_path) as (port, proc, out, earlier):
        for what, request_bytes in MALFORMED.items():
            assert http_abuse.raw(port, request_bytes + body).startswith(b"HTTP/1.0 400 "), what
        whole = (
            abuse.BODY_HEAD.replace(b"Content-Length: 1000", b"Content-Length: %d" % len(body))
            + body
        )
        for cut in (
            len(whole) - 1,
            len(abuse.BODY_HEAD) - 2,
            30,
        ):  # in the body, the headers, the request line
            assert not http_abuse.raw(port, whole[:cut], end=True).startswith(b"HTTP/1.0 200 "), cut
        assert out.read_bytes() == earlier
        assert http_abuse.raw(port, whole).startswith(b"HTTP/1.0 200 ")
        assert_appended(out, earlier, 1)


@pytest.mark.servers
def test_1000_held_connections_do_not_delay_a_page(tmp_path, http_abuse):
    """Connections held open by any local user, as many as --connections, never block the accept
    loop: a page arrives at once, not after they time out (two rounds of the request timeout)."""
    with receiver_with_a_page(tmp_path, "--connections=500", "--request-timeout=30") as (
        port,
        proc,
        out,
        earlier,
    ):
        # what any local user can send: nothing, a request line, a whole request without the token whose body never comes
        anonymous = abuse.BODY_HEAD.replace(
            b"Authorization: Bearer " + abuse.TOKEN.encode() + b"\r\n", b""
        )
        held = http_abuse.hold(port, 1000, heads=(b"", b"POST /page HTTP/1.1\r\n", anonymous))
        http_abuse.wait_closed(
            held, 500
        )  # every held connection taken: 500 served, the 500 oldest closed for them
        p50, worst = http_abuse.timed(
            lambda: abuse.post(port, abuse.notification(), timeout=5)[0] == 200
        )
        print(
            f"\nreceiver, 1,000 held connections (500 served at most): page p50 {p50 * 1000:.0f} ms, max {worst * 1000:.0f} ms"
        )
        assert worst < seconds(1), worst
        assert http_abuse.closed(held) <= 510, (
            "the held connections were not held"
        )  # each request took the place of one
        assert_appended(out, earlier, 10)
