"""`make down` leaves nothing of the stack running: what outlives supervisord (a program slow to
exit on a loaded host) is stopped; the `make down STATE_DIR=...` that asked for it, and another
stack whose directory merely starts the same (`.state` and `.state-lab`), are not."""

import os
import subprocess
import sys

STOP = "import sys; from blockstack_deploy.supervisor import Supervisor; Supervisor(sys.argv[1])._stop_leftovers(grace=5)"


def test_down_stops_leftovers_but_not_its_callers(tmp_path):
    state = str(tmp_path / "state")
    os.makedirs(state)
    straggler = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", f"--config={state}/a.yml"]
    )
    neighbour = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", f"{state}-lab/a.yml"]
    )
    try:
        # the caller's parent names the state directory too, as make does
        caller = subprocess.run(
            ["sh", "-c", f'"{sys.executable}" -c "$0" "$1"; echo survived', STOP, state],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert caller.returncode == 0 and "survived" in caller.stdout, caller
        assert straggler.wait(timeout=10) == -15  # SIGTERM was enough
        assert neighbour.poll() is None  # another stack's directory that merely starts the same
    finally:
        for p in (straggler, neighbour):
            p.kill()
            p.wait()
