"""Fixtures of the whole-stack tests (`make up` in a temporary state directory)."""
import os
import signal
import subprocess
import tempfile

import pytest

from blockstack_deploy import procs

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
COMPONENTS = ("node", "blockstack", "ebpf", "receiver", "alertmanager", "prometheus", "grafana")


@pytest.fixture
def state():
    """(state directory, {component: free port}); `make clean` and a kill of anything left after."""
    d = tempfile.mkdtemp(prefix="blockstack-up-")
    ports = {name: procs.free_port() for name in COMPONENTS}
    try:
        yield d, ports
    finally:
        subprocess.run(["make", "-s", "clean", f"STATE_DIR={d}"], cwd=REPO, capture_output=True, timeout=120)
        for pid in subprocess.run(["pgrep", "-f", d], capture_output=True, text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
