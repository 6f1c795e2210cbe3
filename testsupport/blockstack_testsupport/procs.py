"""Processes for the tests, the benchmarks and the lab: blockstack_deploy.procs's free ports,
starts and sure stops (the stack model runs its servers through them too), and the bounded wait
for a condition that only they need."""

import time

from blockstack_deploy.procs import cmdlines, free_port, http_get, running, stop, wait_http

__all__ = ["cmdlines", "free_port", "http_get", "running", "stop", "wait_http", "wait_until"]


def wait_until(what, predicate, timeout, interval=1.0):
    """Poll predicate until it returns something truthy and return that; at most `timeout` seconds.
    An OSError (a server not listening yet, a connection refused) counts as not yet."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError as e:
            value, last = None, e
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout}s waiting for {what}" + (f": {last}" if last else "")
    )
