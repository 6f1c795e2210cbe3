"""Processes for the tests, the benchmarks and the lab: blockstack_deploy.procs's free ports,
starts and sure stops (the stack model runs its servers through them too), and the bounded wait
for a condition (clock.wait_until, here too for its many callers)."""

from blockstack_deploy.procs import cmdlines, free_port, http_get, running, stop, wait_http

from .clock import wait_until

__all__ = ["cmdlines", "free_port", "http_get", "running", "stop", "wait_http", "wait_until"]
