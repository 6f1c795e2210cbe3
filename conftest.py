"""Every test directory's common rules: a test marked `root` fails, never skips, without root; a
case run with the servers built from the Go module proxy (a `servers` parameter "upstream", as
blockstack_deploy.stack.SERVERS names them) is marked `built`, so `make test-unit` needs no Go build, and `long`: `make test-long` runs it."""

import contextlib
import os
import resource
import select
import socket
import statistics
import time

import pytest
from hypothesis import settings

from blockstack_testsupport.clock import seconds, wait_until

# Property tests check results, not speed: hypothesis' default 200 ms deadline per example made them
# fail as "flaky" whenever the 2-core machine was busy with the servers and VM tests beside them.
settings.register_profile("blockstack", deadline=None)
settings.load_profile("blockstack")


def pytest_runtest_setup(item):
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.fail(
            "needs root (loop devices, mounts, BPF, sysfs writes): run it as root; "
            "`make test-unit` runs the tests that do not",
            pytrace=False,
        )


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("servers") == "upstream":
            item.add_marker(pytest.mark.built)
            item.add_marker(pytest.mark.long)


class HttpAbuse:
    """The clients of the HTTP servers' hardening tests (blockstack_http and its three users)."""

    def __init__(self):
        self._stack = contextlib.ExitStack()
        self._limit = resource.getrlimit(resource.RLIMIT_NOFILE)

    def hold(self, port, count, heads=(b"",)):
        """count connections to 127.0.0.1:port, the i-th sent heads[i % len(heads)] and then
        nothing, kept open until the test ends; the descriptor limit raised for them (and
        restored after). Returns the sockets."""
        soft, hard = self._limit
        need = count + 1024  # the test's own files, servers in this process, pytest's
        if soft != resource.RLIM_INFINITY and soft < need:
            if hard != resource.RLIM_INFINITY and hard < need:
                pytest.fail(
                    f"RLIMIT_NOFILE's hard limit {hard} is below the {need} descriptors this test needs"
                )
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        held = []
        for i in range(count):
            s = self._stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
            head = heads[i % len(heads)]
            if head:
                s.sendall(head)
            held.append(s)
        return held

    @staticmethod
    def raw(port, data, timeout=10, end=False):
        """Everything a server sends back for `data` on a connection of its own, until it closes
        (at most `timeout` seconds, stretched by the tests' clock); end: the sending side is shut
        down after data (a request cut off by its client: servers that look for an aborted
        request take this one for one too)."""
        timeout = seconds(timeout)
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            try:
                s.sendall(data)
                if end:
                    s.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # closed by the server already: what it sent, if anything, is still read
            answer, deadline = b"", time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                answer += chunk
            return answer

    @staticmethod
    def closed(sockets):
        """How many of the sockets the server has closed (EOF or reset waiting), without blocking."""
        count = 0
        for s in sockets:
            poller = select.poll()  # not select.select: no descriptors above 1023
            poller.register(s, select.POLLIN)
            if poller.poll(0):
                try:
                    count += s.recv(1, socket.MSG_PEEK) == b""  # readable: recv does not wait
                except OSError:
                    count += 1
        return count

    def wait_closed(self, sockets, count, seconds=20):
        """Wait until the server has closed at least count of the sockets (at most `seconds`,
        stretched by the tests' clock)."""
        wait_until(
            f"the server closing {count} of the connections",
            lambda: self.closed(sockets) >= count,
            seconds,
            0.05,
        )

    @staticmethod
    def timed(request, times=10):
        """(p50, max) seconds of `times` calls of request() one after the other; each must return true."""
        seconds = []
        for _ in range(times):
            start = time.monotonic()
            assert request()
            seconds.append(time.monotonic() - start)
        return statistics.median(seconds), max(seconds)

    def close(self):
        self._stack.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, self._limit)


@pytest.fixture
def http_abuse():
    """HttpAbuse: held connections, raw requests, timings; every connection closed after the test."""
    abuse = HttpAbuse()
    try:
        yield abuse
    finally:
        abuse.close()
