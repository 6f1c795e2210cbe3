"""The tests' one clock: every deadline a test waits for or asserts is seconds(n), n as on a quiet
2-core machine, times BLOCKSTACK_TEST_TIME_FACTOR (default 1; e.g. 3 on a machine loaded by other
work). wait_until applies it to its timeout."""

import math
import os
import time

TIME_FACTOR_VARIABLE = "BLOCKSTACK_TEST_TIME_FACTOR"


def _factor():
    text = os.environ.get(TIME_FACTOR_VARIABLE, "1")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{TIME_FACTOR_VARIABLE}={text!r}: expected a positive number of times")
    return value


TIME_FACTOR = _factor()


def seconds(n):
    """A test deadline of n seconds (as on a quiet machine), stretched by TIME_FACTOR."""
    return n * TIME_FACTOR


def wait_until(what, predicate, timeout, interval=1.0):
    """Poll predicate until it returns something truthy and return that; fails with TimeoutError
    once seconds(timeout) have passed (predicate is asked once more at the deadline). An OSError
    (a server not listening yet, a connection refused) counts as not yet."""
    limit = seconds(timeout)
    deadline = time.monotonic() + limit
    last = None
    while True:
        try:
            value = predicate()
        except OSError as e:
            value, last = None, e
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"timed out after {limit:g} s waiting for {what}" + (f": {last}" if last else "")
            )
        time.sleep(interval)
