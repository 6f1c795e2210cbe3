"""Bad values cost one sample, hung devices and commands cost their own metrics only, and the
HTTP side serves only scrapes, one collection for many requests. Each test names the failure it
guards against."""

import contextlib
import errno
import logging
import os
import resource
import signal
import subprocess
import threading
import time

import pytest
from exporter_testlib import HOST_LOOP, Scraped, exporter_argv, full_tree, http, registry_for
from fuzzing import ABORTED, HALF_SENT, SLOW, closed_by_exporter, damaged_request

from blockstack_exporter import server
from blockstack_exporter.collectors import ALL
from blockstack_exporter.fs import BlockingReads
from blockstack_exporter.scrape import SHARES, Scrape, deadline
from blockstack_testsupport import procs
from blockstack_testsupport.clock import seconds, wait_until

LOOP0 = "sys/devices/virtual/block/loop0"


def write(tree, rel, data):
    path = os.path.join(tree, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def promtool_ok(text):
    r = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    return r.returncode == 0, r.stdout + r.stderr


# --- one bad value costs one sample --------------------------------------------------------------


def test_names_that_are_not_utf8_cost_their_samples_only(host_tree):
    """Guards against a UnicodeEncodeError in the exposition: HTTP 500 for the whole scrape."""
    os.symlink(
        "../../devices/virtual/block/loop0", os.fsencode(host_tree) + b"/sys/class/block/sd\xff"
    )
    write(host_tree, "proc/fs/ext4/" + os.fsdecode(b"x\xfe") + "/options", "rw\n")
    write(
        host_tree,
        "proc/fs/jbd2/" + os.fsdecode(b"x\xfe-8") + "/info",
        "1 transactions (1 requested), each up to 8 blocks\n",
    )
    s = Scraped(registry_for(host_tree))
    assert s.get("blockstack_queue_nomerges", device="loop0") == 2
    assert s.errors(reason="label_value") >= 3
    ok, out = promtool_ok(s.text)
    assert ok, out


def test_huge_integers_cost_one_sample(host_tree):
    """Guards against 310 digits -> OverflowError in the exposition (HTTP 500), and 4,300+ digits
    in jbd2 info -> ValueError failing the whole jbd2 collector."""
    write(host_tree, f"{LOOP0}/queue/nr_requests", "9" * 400 + "\n")
    write(
        host_tree,
        "proc/fs/jbd2/loop0-8/info",
        "9" * 5000 + " transactions (1 requested), each up to 8 blocks\n",
    )
    with open(os.path.join(HOST_LOOP, "proc/fs/jbd2/loop1-8/info")) as f:
        info = f.read()
    handles = [line for line in info.splitlines() if "handles per transaction" in line][0]
    write(
        host_tree,
        "proc/fs/jbd2/loop1-8/info",
        info.replace(handles, "  " + "9" * 350 + " handles per transaction")
        + "  "
        + "7" * 4400
        + " blocks per transaction\n",
    )
    s = Scraped(registry_for(host_tree))
    assert s.get("blockstack_queue_nr_requests", device="loop0") is None
    assert s.get("blockstack_queue_nomerges", device="loop0") == 2
    assert s.get("blockstack_scrape_collector_success", collector="jbd2") == 1
    assert s.get("blockstack_jbd2_transactions_total", device="loop0", journal="loop0-8") is None
    assert (
        s.get("blockstack_jbd2_transactions_total", device="loop1", journal="loop1-8") is not None
    )
    assert s.errors("queue", "parse") == 1 and s.errors("jbd2", "parse") >= 2
    ok, out = promtool_ok(s.text)
    assert ok, out


def test_symlink_loops_cost_what_is_behind_them(host_tree):
    """Guards against ELOOP from listing /proc/fs/ext4 (or slaves/) failing the whole collector."""
    ext4 = os.path.join(host_tree, "proc/fs/ext4")
    os.rename(ext4, ext4 + ".real")
    os.symlink("ext4", ext4)  # a link to itself: ELOOP
    os.unlink(os.path.join(host_tree, f"{LOOP0}/queue/nomerges"))
    os.symlink("nomerges", os.path.join(host_tree, f"{LOOP0}/queue/nomerges"))
    s = Scraped(registry_for(host_tree))
    assert s.get("blockstack_scrape_collector_success", collector="ext4") == 1
    assert s.errors("ext4", "unreadable") == 1
    assert s.get("blockstack_queue_nomerges", device="loop0") is None
    assert s.get("blockstack_queue_max_sectors_bytes", device="loop0") == 4096
    assert s.errors("queue", "unreadable") == 1


def test_garbage_text_values_are_bounded(host_tree):
    """Guards against 10 MB of ext4 options as ~1,700 series and a 5,000-character label."""
    write(host_tree, "proc/fs/ext4/loop0/options", "".join(f"opt{i}=v\n" for i in range(1_000_000)))
    write(host_tree, "proc/fs/ext4/loop1/options", "".join(f"o{i}\n" for i in range(500)))
    write(host_tree, f"{LOOP0}/queue/scheduler", "[" + "x" * 5000 + "]\n")
    registry = registry_for(host_tree)
    s = Scraped(registry)
    options = [k for k in s.samples if k[0] == "blockstack_ext4_option_info"]
    assert not [
        k for k in options if ("device", "loop0") in k[1]
    ]  # larger than any options file: dropped
    assert len([k for k in options if ("device", "loop1") in k[1]]) == 128
    assert s.errors("ext4", "too_large") == 1 and s.errors("ext4", "series_limit") == 500 - 128
    assert not [
        k
        for k in s.samples
        if k[0] == "blockstack_queue_scheduler_info" and ("device", "loop0") in k[1]
    ]
    assert s.errors("queue", "label_value") == 1


def test_a_repeated_condition_is_logged_once_and_counted_every_time(host_tree, caplog, monkeypatch):
    """Guards against the same warning on every scrape (the journal size's EPERM every 5 s)."""

    def denied(self, path, *args):
        raise PermissionError(errno.EPERM, "Operation not permitted", path)

    monkeypatch.setattr(BlockingReads, "pread", denied)
    registry = registry_for(host_tree)
    caplog.set_level(logging.INFO, logger="blockstack_exporter")
    for garbage in ("two", "three", "four"):  # another message, the same condition
        write(host_tree, f"{LOOP0}/queue/nomerges", garbage + "\n")
        s = Scraped(registry)
    assert (
        s.errors("queue", "parse") == 3 and s.errors("ext4", "unreadable") == 3 * 3
    )  # loop0, loop1, vda
    assert caplog.text.count("loop0: nomerges") == 1
    assert caplog.text.count("loop1: journal size: [Errno 1] Operation not permitted") == 1
    write(host_tree, f"{LOOP0}/queue/nomerges", "0\n")
    Scraped(registry)
    Scraped(registry)
    assert caplog.text.count("no longer: loop0: nomerges") == 1


def test_dmsetup_garbage_is_bounded(tmp_path, monkeypatch, caplog):
    """Guards against 10 MB of garbage from dmsetup costing seconds, ~278k log lines, ~300 MB."""
    tree, fixtures = full_tree(str(tmp_path))
    monkeypatch.setenv("FAKE_DMSETUP_FIXTURES", fixtures)
    with open(os.path.join(fixtures, "dmsetup_status_--noflush"), "w") as f:
        f.write("g: x\n" * 2_000_000)  # 10 MB of bad lines
    with open(os.path.join(fixtures, "dmsetup_table"), "a") as f:
        f.write("bad line\n" * 50_000)  # 450 kB: read, each bad line counted, one log line
    registry = registry_for(tree, "--collector.disable-defaults", "--collector.dm")
    caplog.set_level(logging.INFO, logger="blockstack_exporter")
    cpu = time.process_time()  # this process's CPU time: the cost, whatever else the machine runs
    s = Scraped(registry)
    assert time.process_time() - cpu < 4
    assert s.errors("dm", "too_large") == 1 and s.errors("dm", "parse") == 50_000
    assert s.get("blockstack_dm_snapshot_chunk_size_bytes", device="dm-3", name="vg-snap") == 4096
    assert len(caplog.records) <= 5


# --- a hung device must not hang the exporter ------------------------------------------------------


def test_a_fifo_in_place_of_a_device_costs_its_journal_size_only(host_tree, monkeypatch):
    """Guards against a superblock read blocking the scrape forever (holding the scrape lock),
    and against a read started again by each scrape while the last has not returned (a thread
    more per scrape for as long as the device hangs)."""
    os.unlink(os.path.join(host_tree, "dev/loop1"))
    fifo = os.path.join(host_tree, "dev/loop1")
    os.mkfifo(fifo)
    registry = registry_for(host_tree)
    journal_errors = []  # the messages each scrape counted for loop1's journal size, in order
    count_error = Scrape.error

    def error(self, message, *args, **kwargs):
        if message.startswith("loop1: journal size: "):
            journal_errors.append(message)
        return count_error(self, message, *args, **kwargs)

    monkeypatch.setattr(Scrape, "error", error)

    def scrape():  # in a thread of its own with a 1 s budget, as the server gives a request
        results = []

        def run():
            with deadline(time.monotonic() + 1.0):
                results.append(Scraped(registry))

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(seconds(10))
        assert results, "the scrape hung on the FIFO"
        return results[0]

    def reads():
        """The threads reading the FIFO (fs.BlockingReads runs each read in one of its own)."""
        return [t for t in threading.enumerate() if t.name == f"read {fifo}"]

    def pending():
        """A scrape after which the FIFO's read is pending and loop0's journal size is known (and
        so kept: only loop1's read is left). Under load a scrape's budget can run out before the
        ext4 collector reaches loop1, or before loop0's read returns: the next scrape goes on."""
        s = scrape()
        lower = dict(device="loop0", mountpoint="/mnt/blockstack-lower")
        return reads() and s.get("blockstack_ext4_journal_size_bytes", **lower) is not None and s

    try:
        before = wait_until("the FIFO's read pending", pending, 30, interval=0)
        readers = reads()
        assert len(readers) == 1, readers  # however many scrapes it took to start it
        counted = len(journal_errors)
        s = scrape()  # the read still pending: skipped at once, no new read
        assert reads() == readers, "another read of the FIFO was started"
        assert sum("no answer within" in m for m in journal_errors) == 1, journal_errors
        assert len(journal_errors) == counted + 1, journal_errors[counted:]
        assert journal_errors[-1].endswith("has not returned; skipped"), journal_errors[-1]
        assert s.errors("ext4", "timeout") == before.errors("ext4", "timeout") + 1
        assert (
            s.get(
                "blockstack_ext4_journal_size_bytes",
                device="loop1",
                mountpoint="/mnt/blockstack-upper",
            )
            is None
        )
        assert (
            s.get(
                "blockstack_ext4_dioread_nolock", device="loop1", mountpoint="/mnt/blockstack-upper"
            )
            == 0
        )
        assert (
            s.get(
                "blockstack_ext4_journal_size_bytes",
                device="loop0",
                mountpoint="/mnt/blockstack-lower",
            )
            is not None
        )
    finally:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # releases the reader
        os.close(fd)


def test_collector_deadlines_add_up_to_less_than_the_scrape_timeout():
    assert sum(SHARES.values()) <= 1.0
    assert set(SHARES) == set(ALL)


@pytest.fixture
def dm_exporter(tmp_path):
    """The real exporter on a tree with dm devices; fake dmsetup's mode per test (env)."""
    tree, fixtures = full_tree(str(tmp_path))
    log = tmp_path / "dmsetup.log"

    def start(mode="ok", sleep="60", extra=()):
        port = procs.free_port()
        env = {
            "FAKE_DMSETUP_FIXTURES": fixtures,
            "FAKE_DMSETUP_MODE": mode,
            "FAKE_DMSETUP_SLEEP": sleep,
            "FAKE_DMSETUP_LOG": str(log),
        }
        url = f"http://127.0.0.1:{port}"
        return url, procs.running(
            exporter_argv(tree, port, *extra),
            env=env,
            health_url=url + "/",
            log_path=str(tmp_path / "exporter.log"),
        )

    start.calls = lambda: len(log.read_text().splitlines()) if log.exists() else 0
    return start


def test_a_hung_dmsetup_costs_the_dm_metrics_within_the_scrape_timeout(dm_exporter):
    """Guards against scrapes of 5.07-5.12 s against the stack's 5 s timeout (the target down)."""
    url, running = dm_exporter(mode="hang")
    with running:
        for timeout in ("5", "2"):
            status, body, took = http(
                url + "/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": timeout}
            )
            assert status == 200 and took < seconds(float(timeout)), took
            s = Scraped(body)
            assert s.success("dm") == 0 and s.success("queue") == 1
            assert s.errors("dm", "timeout") >= 1


# --- HTTP: only scrapes, one collection for many requests ----------------------------------------


def test_only_get_metrics_and_the_landing_page(dm_exporter):
    """Guards against any method on any path running a collection and answering the metrics."""
    url, running = dm_exporter()
    with running:
        calls = dm_exporter.calls()
        assert http(url + "/nothing")[0] == 404
        for method in ("POST", "PUT", "DELETE", "HEAD", "OPTIONS"):
            assert http(url + "/metrics", method=method)[0] == 405, method
        status, body, _ = http(url + "/")
        assert status == 200 and "blockstack_" not in body and "/metrics" in body
        assert dm_exporter.calls() == calls  # none of these ran a collection
        assert http(url + "/metrics")[0] == 200 and dm_exporter.calls() == calls + 2


def test_aborted_and_half_sent_requests_run_no_collection(dm_exporter):
    """Guards against 20 aborted requests running 20 collections (40 dmsetup runs as root).

    Each request is closed before the exporter looks at it: the exporter is stopped (SIGSTOP,
    waited for until every thread is stopped) while the requests are sent and closed (the
    kernel queues the connections, their requests and their closes), then continued. Sent to a
    running exporter under load, a close could arrive after the exporter had read the whole
    request and found the client still there, and that request, no longer aborted when it was
    looked at, ran a collection. The count is read once the exporter has closed every one of
    the connections, not after a guessed sleep."""
    url, running = dm_exporter()
    with running as proc:
        calls = dm_exporter.calls()
        port = int(url.rsplit(":", 1)[1])
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_until("every thread of the exporter stopped", lambda: stopped(proc.pid), 20, 0.02)
            for _ in range(10):
                damaged_request(url, HALF_SENT)
                damaged_request(url, ABORTED)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        wait_until(
            "the exporter closing every connection", lambda: connections_open(port) == 0, 20, 0.02
        )
        assert dm_exporter.calls() == calls


def stopped(pid):
    """Every thread of the process stopped: SIGSTOP returns before the threads stop (each stops
    on its way back to user space)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as f:
            if (
                f.read().rsplit(")", 1)[1].split()[0] not in "tT"
            ):  # the state, after the command's name
                return False
    return True


def connections_open(port):
    """Connections to 127.0.0.1:port whose server side is not closed yet: established, or with
    the client's close received but the server's not sent (CLOSE_WAIT) (/proc/net/tcp)."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return sum(1 for row in rows if row[1] == f"0100007F:{port:04X}" and row[3] in ("01", "08"))


def test_concurrent_scrapes_share_one_collection(dm_exporter):
    """Guards against every request running its own collection in turn (500 scrapes: 110 s)."""
    url, running = dm_exporter(mode="hang", sleep="1")  # each dmsetup run takes 1 s
    with running:
        calls = dm_exporter.calls()
        results = []
        threads = [
            threading.Thread(target=lambda: results.append(http(url + "/metrics")), daemon=True)
            for _ in range(30)
        ]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(results) == 30 and all(r[0] == 200 for r in results)
        assert time.monotonic() - start < seconds(10)
        assert (
            dm_exporter.calls() - calls <= 2 * 3
        )  # table + status per collection, at most 3 collections


def test_slow_connections_do_not_block_a_real_scrape(dm_exporter, http_abuse):
    """Connections that never finish their request are closed after a few seconds and hold no
    collection; a real scrape meanwhile is answered at once."""
    url, running = dm_exporter()
    with running:
        calls = dm_exporter.calls()
        slow = [damaged_request(url, SLOW, keep_open=True) for _ in range(100)]
        try:
            status, _, took = http(url + "/metrics")
            assert status == 200 and took < seconds(3)
            assert dm_exporter.calls() == calls + 2
            http_abuse.wait_closed(slow, len(slow), 7)  # the request deadline is 5 s
            assert closed_by_exporter(slow, 1) == len(slow)
        finally:
            for s in slow:
                s.close()
        assert dm_exporter.calls() == calls + 2


def test_scrapes_are_answered_when_sockets_get_descriptors_above_1023(host_tree):
    """Guards against checking for an aborted request with select(), which refuses descriptors
    above 1023; the exporter keeps a descriptor per sysfs attribute (~7,000 with 1,000 devices),
    so on such hosts scrapes would intermittently get a closed connection and no answer."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held = []
    port = procs.free_port()
    httpd, _ = server.serve(registry_for(host_tree), "127.0.0.1", port, 4.5, 0.5)
    try:
        while not held or held[-1] < 1100:  # the next sockets are numbered above 1023
            held.append(os.open(os.devnull, os.O_RDONLY))
        for _ in range(3):
            assert http(f"http://127.0.0.1:{port}/metrics")[0] == 200
    finally:
        httpd.shutdown()
        httpd.server_close()
        for fd in held:
            os.close(fd)


@contextlib.contextmanager
def exporter_in_process(tree, **options):
    """The exporter's HTTP server over a fixture tree in this process (options: blockstack_http.Server's);
    yields (server, port), stopped after."""
    httpd = server.Server(("127.0.0.1", 0), server.Exporter(registry_for(tree)), **options)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd, httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


MALFORMED = {
    "a bad request line": b"GET /metrics HTTP/1.1 x\r\n\r\n",
    "a control character in the query": b"GET /metrics?x=\x1b[2J HTTP/1.1\r\n\r\n",
    "HTTP/0.9": b"GET /metrics\r\n\r\n",
    "a bad header": b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_request_gets_400_and_no_collection(host_tree, http_abuse, request_bytes):
    """Guards against a 400 as a bare body (no status line, no headers), HTTP/0.9 answered by a
    closed connection, and a control character in the query or a header line without a colon
    answered 200 with a collection."""
    with exporter_in_process(host_tree) as (httpd, port):
        assert http_abuse.raw(port, request_bytes).startswith(b"HTTP/1.0 400 ")
        assert httpd.exporter.collections == 0
        assert http(f"http://127.0.0.1:{port}/metrics")[0] == 200
        assert httpd.exporter.collections == 1


def test_1000_held_connections_do_not_delay_a_scrape(host_tree, http_abuse):
    """Guards against closing the newest connection at MAX_CONNECTIONS, the real scrape too
    (here 500 at most, 1,000 held: every scrape would fail)."""
    with exporter_in_process(host_tree, max_connections=500, request_seconds=30) as (httpd, port):
        held = http_abuse.hold(port, 1000, heads=(b"", HALF_SENT, SLOW))
        http_abuse.wait_closed(
            held, 500
        )  # every held connection taken: 500 served, the 500 oldest closed for them
        p50, worst = http_abuse.timed(
            lambda: http(f"http://127.0.0.1:{port}/metrics", timeout=5)[0] == 200
        )
        print(
            f"\nexporter, 1,000 held connections (500 served at most): scrape p50 {p50 * 1000:.0f} ms, max {worst * 1000:.0f} ms"
        )
        assert worst < seconds(1), worst
        assert httpd.exporter.collections == 10
        assert (
            http_abuse.closed(held) <= 510 and httpd.refused == 0
        )  # each scrape took the place of one
