#!/usr/bin/env python3
"""HTTP abuse of the page receiver, as a benchmark: the receiver of a baseline git revision and
the one in this tree, side by side in one run (alerts/tests/test_receiver.py uses the same clients).

    .venv/bin/python alerts/tests/abuse.py [--baseline d822752]

Prints, for each: how many of 500 concurrent notifications were answered 200 and how many reset;
the receiver's peak RSS under 10 concurrent 8 MiB and 32 concurrent 1 MiB notifications; the
seconds until a body or headers trickled at one byte per 0.1 s are dropped (30 s at most); how
long a page waits while 40 connections trickle. A fresh receiver for each; ~2 min. Needs the lab
kit (`make venv`); starts each receiver on a free 127.0.0.1 port and stops it after.
"""

import argparse
import collections
import contextlib
import errno
import http.client
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time

import page_receiver
from blockstack_testsupport import procs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = page_receiver.__file__


def fill(directory, limit):
    """Fill the filesystem of directory with the file `filler` (4 KiB at a time, `limit` bytes at
    the most: a test's small tmpfs); its path. Fails the test if the limit came first."""
    filler = os.path.join(directory, "filler")
    with open(filler, "wb", buffering=0) as f:
        for _ in range(limit // 4096 + 1):
            try:
                f.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return filler
    raise AssertionError(f"{directory}: a filesystem of at most {limit} bytes took more")


def notification(size=None, alertname="BlockStackMergeCollapse", status="firing"):
    """An Alertmanager (0.25, version 4) webhook body, padded to exactly `size` bytes if given."""
    alert = {
        "status": status,
        "labels": {
            "alertname": alertname,
            "device": "loop0",
            "host": "lab",
            "severity": "critical",
            "stack": "loop1",
        },
        "annotations": {"summary": "merges collapsed", "description": ""},
        "startsAt": "2026-11-23T09:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://127.0.0.1:9090/graph",
        "fingerprint": "0123456789abcdef",
    }
    payload = {
        "receiver": "page",
        "status": status,
        "alerts": [alert],
        "groupLabels": {"host": "lab", "stack": "loop1"},
        "commonLabels": alert["labels"],
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "version": "4",
        "groupKey": '{}/{severity="critical"}:{host="lab", stack="loop1"}',
        "truncatedAlerts": 0,
    }
    body = json.dumps(payload).encode()
    if size is not None:
        alert["annotations"]["description"] = "x" * (size - len(body))
        body = json.dumps(payload).encode()
        assert len(body) == size, (len(body), size)
    return body


TOKEN = "abuse-benchmark-token"  # the bearer token post() sends and receiver() gives this tree's receiver


@contextlib.contextmanager
def receiver(out_file, *args, script=SCRIPT, log_path=None):
    """The receiver `script` writing out_file on a free port (this tree's with TOKEN; a baseline
    from before the token takes none); yields (port, process)."""
    port = procs.free_port()
    argv = [sys.executable, script, f"--listen=127.0.0.1:{port}", f"--file={out_file}", *args]
    with tempfile.NamedTemporaryFile("w", prefix="receiver-token-") as token:
        token.write(TOKEN + "\n")
        token.flush()
        if script == SCRIPT:
            argv.append(f"--token-file={token.name}")
        with procs.running(
            argv, health_url=f"http://127.0.0.1:{port}/healthz", log_path=log_path
        ) as proc:
            yield port, proc


SWITCH = os.path.join(os.path.dirname(SCRIPT), "dead_mans_switch.py")


@contextlib.contextmanager
def dead_mans_switch(directory, timeout):
    """alerts/receiver/dead_mans_switch.py (the stand-in for an off-host switch) on a free port,
    paging after `timeout` seconds without a ping; its token, events and log in `directory`.
    Yields (the ping URL, a file holding it for --heartbeat-url-file, port, events file)."""
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    port, token = procs.free_port(), os.urandom(16).hex()
    paths = {
        name: os.path.join(directory, name)
        for name in ("token", "url", "events.jsonl", "switch.log")
    }
    url = f"http://127.0.0.1:{port}/ping/{token}"
    for name, text in (("token", token), ("url", url)):
        with open(paths[name], "w") as f:
            f.write(text + "\n")
    argv = [
        sys.executable,
        SWITCH,
        f"--listen=127.0.0.1:{port}",
        f"--token-file={paths['token']}",
        f"--timeout={timeout}",
        f"--file={paths['events.jsonl']}",
    ]
    with procs.running(
        argv, health_url=f"http://127.0.0.1:{port}/healthz", log_path=paths["switch.log"]
    ):
        yield url, paths["url"], port, paths["events.jsonl"]


def switch_status(port):
    return json.loads(procs.http_get(f"http://127.0.0.1:{port}/status"))


def switch_events(events_file):
    """The switch's pages ("down") and resolves ("up"), oldest first."""
    try:
        with open(events_file) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def post(port, body, path="/page", method="POST", headers=None, timeout=60):
    """(status, answer) of one request on a connection of its own; (exception name, b"") if none came."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            method,
            path,
            body=body,
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {TOKEN}",
                **(headers or {}),
            },
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException) as e:
        return type(e).__name__, b""
    finally:
        conn.close()


def concurrently(port, bodies, timeout=60):
    """Counter of the outcomes (status or exception name) of posting every body at the same moment."""
    outcomes = collections.Counter()
    start = threading.Barrier(len(bodies))

    lock = threading.Lock()

    def one(body):
        start.wait()
        status, _ = post(port, body, timeout=timeout)
        with lock:
            outcomes[status] += 1

    threads = [threading.Thread(target=one, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return outcomes


def trickle(port, head, interval=0.1, limit=30.0):
    """Send head, then one byte per interval until the receiver answers or closes: (seconds, answer),
    or (None, b"") if it still held the connection after `limit` seconds."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head)
        poll = (
            select.poll()
        )  # not select.select: it fails on descriptors >= 1024 (a test process may hold many)
        poll.register(s, select.POLLIN)
        while time.monotonic() - start < limit:
            readable = poll.poll(interval * 1000)
            try:
                if readable:
                    answer = s.recv(65536)
                    return time.monotonic() - start, answer
                s.send(b" ")
            except OSError:
                return time.monotonic() - start, b""
    return None, b""


def peak_rss(pid):
    """VmHWM of pid in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def _outcomes(got):
    return ", ".join(
        f"{n} {k if isinstance(k, str) else 'answered %d' % k}"
        for k, n in sorted(got.items(), key=str)
    )


BODY_HEAD = (
    b"POST /page HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
    + TOKEN.encode()
    + b"\r\nContent-Length: 1000\r\n\r\n"
)


def held(port, count, head=b"POST /page HTTP/1.1\r\n"):
    """count connections that each send `head` and then nothing: a context that holds them open."""
    stack = contextlib.ExitStack()
    for _ in range(count):
        s = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
        s.sendall(head)
    return stack


def measure(script, workdir):
    """{what: figure} for the receiver `script`, a fresh receiver for each abuse."""
    out = os.path.join(workdir, "pages.jsonl")
    log = os.path.join(workdir, "receiver.log")
    figures = {}
    with receiver(out, script=script, log_path=log) as (port, proc):
        t0 = time.monotonic()
        got = concurrently(port, [notification()] * 500)
        figures["500 concurrent notifications"] = (
            f"{_outcomes(got)} ({time.monotonic() - t0:.1f} s)"
        )
    for count, size in ((10, 8 << 20), (32, 1 << 20)):
        with receiver(out, script=script, log_path=log) as (port, proc):
            rss0 = peak_rss(proc.pid)
            got = concurrently(port, [notification(size)] * count)
            figures[f"{count} concurrent x {size >> 20} MiB"] = (
                f"{_outcomes(got)}; peak RSS {rss0 / 2**20:.0f} -> {peak_rss(proc.pid) / 2**20:.0f} MiB"
            )
    for what, head in (
        ("trickled body", BODY_HEAD),
        ("trickled headers", b"POST /page HTTP/1.1\r\nX-Slow: "),
    ):
        with receiver(out, script=script, log_path=log) as (port, proc):
            seconds, answer = trickle(port, head)
            first = answer.split(b"\r\n", 1)[0].decode(errors="replace")
            figures[what + " (1 byte / 0.1 s)"] = (
                "still held after 30 s"
                if seconds is None
                else f"dropped after {seconds:.1f} s ({first or 'closed'})"
            )
    with receiver(out, script=script, log_path=log) as (port, proc), held(port, 200):
        time.sleep(1)
        t0 = time.monotonic()
        status, _ = post(port, notification(), timeout=120)
        figures["a page while 200 connections send only a request line"] = (
            f"{status} after {time.monotonic() - t0:.1f} s"
        )
    with receiver(out, script=script, log_path=log) as (port, proc):
        # without the token: what a foreign web page or another local user can send
        anonymous = BODY_HEAD.replace(b"Authorization: Bearer " + TOKEN.encode() + b"\r\n", b"")
        holders = [
            threading.Thread(target=trickle, args=(port, anonymous), kwargs={"limit": 15})
            for _ in range(40)
        ]
        for t in holders:
            t.start()
        time.sleep(1)
        t0 = time.monotonic()
        status, _ = post(port, notification())
        figures["a page while 40 connections trickle a body (no token)"] = (
            f"{status} after {time.monotonic() - t0:.1f} s"
        )
        for t in holders:
            t.join()
    return figures


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--baseline",
        default="d822752",
        help="git revision of the receiver to compare (default %(default)s)",
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="receiver-abuse-") as tmp:
        old = os.path.join(tmp, "page_receiver_baseline.py")
        with open(old, "wb") as f:
            f.write(
                subprocess.run(
                    [
                        "git",
                        "-C",
                        REPO,
                        "show",
                        f"{args.baseline}:alerts/receiver/page_receiver.py",
                    ],
                    check=True,
                    capture_output=True,
                ).stdout
            )
        results = {}
        for name, script in ((args.baseline, old), ("this tree", SCRIPT)):
            os.makedirs(os.path.join(tmp, name.replace(" ", "-")))
            results[name] = measure(script, os.path.join(tmp, name.replace(" ", "-")))
    for what in results["this tree"]:
        print(what)
        for name, figures in results.items():
            print(f"  {name:<10} {figures[what]}")


if __name__ == "__main__":
    main()
