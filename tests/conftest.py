"""Fixtures of the whole-stack tests (`make up` in a temporary state directory)."""

import os
import signal
import subprocess
import tempfile
import time

import pytest

from blockstack_testsupport import procs

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
COMPONENTS = (
    "node",
    "blockstack",
    "ebpf",
    "receiver",
    "receiver-self",
    "alertmanager",
    "prometheus",
    "grafana",
)


@pytest.fixture
def state():
    """(state directory, {component: free port}, make); `make clean` and a kill of anything left after.
    make(TARGET, UP_ARG..., variables=()) runs `make -s TARGET` on them: (its output, seconds)."""
    d = tempfile.mkdtemp(prefix="blockstack-up-")
    ports = {name: procs.free_port() for name in COMPONENTS}

    def make(target, *up_args, variables=()):
        args = " ".join([*(f"--port {name}={port}" for name, port in ports.items()), *up_args])
        start = time.monotonic()
        r = subprocess.run(
            ["make", "-s", target, f"STATE_DIR={d}", f"UP_ARGS={args}", *variables],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, f"make {target} failed:\n{r.stdout}\n{r.stderr}"
        return r.stdout, time.monotonic() - start

    try:
        yield d, ports, make
    finally:
        subprocess.run(
            ["make", "-s", "clean", "FORCE=1", f"STATE_DIR={d}"],
            cwd=REPO,
            capture_output=True,
            timeout=120,
        )
        for pid in subprocess.run(
            ["pgrep", "-f", d], capture_output=True, text=True
        ).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
