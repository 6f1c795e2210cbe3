"""Fixtures of the dashboard tests. `lab` is one lab run (dashboards/lab_run.py) shared by every
test of the session: loop devices under load in a healthy, a collapsed and an fsync phase, scraped
by the whole stack. The lead may hoist it to a shared conftest; it only needs dashboards/ on
sys.path."""
import json
import os
import sys

import pytest

DASHBOARDS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, DASHBOARDS)

import blockstack_dashboard  # noqa: E402
import lab_run  # noqa: E402


@pytest.fixture(scope="session")
def dashboard():
    """The committed dashboard JSON."""
    with open(blockstack_dashboard.OUTPUT) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """A finished lab run whose stack is still up: .stack (lab Stack, .query() etc.), .upper and
    .lower (kernel names of the stacked loop devices), .mountpoint (ext4 on upper), .start/.end
    and .phases {healthy|collapsed|fsync: (start, end)} in Unix seconds."""
    why = lab_run.missing_requirements()
    if why:  # a core test: fail loudly rather than skip (make test installs and builds all of it)
        pytest.fail(f"lab run impossible here: {why}")
    with lab_run.lab_run(str(tmp_path_factory.mktemp("dashboard-lab"))) as run:
        yield run
