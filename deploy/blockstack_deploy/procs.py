"""Servers started without a supervisor (Stack.running, the tests, the lab): free loopback ports,
health waits, sure stops. The tests' own helpers are in blockstack_testsupport.procs."""

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request


def free_port():
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmdlines():
    """(pid, [argument, ...] as bytes) of every process running now, from /proc/PID/cmdline; a
    process gone while this reads is left out."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                yield int(entry), f.read().split(b"\0")
        except OSError:
            continue


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_http(url, timeout=30, proc=None):
    """Poll url until it answers 2xx; fail early if proc died. Bounded by timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            http_get(url, timeout=2)
            return
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s: {last}")


@contextlib.contextmanager
def running(argv, env=None, health_url=None, log_path=None, timeout=30):
    """Start argv in its own process group; wait for health_url; kill the group on exit."""
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
    )
    try:
        if health_url:
            wait_http(health_url, timeout=timeout, proc=proc)
        yield proc
    finally:
        stop(proc)
        if log_path:
            log.close()


def stop(proc, grace=10):
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(grace)
