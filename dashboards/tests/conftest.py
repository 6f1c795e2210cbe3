"""Fixtures of the dashboard tests; dashboards/ goes on sys.path for them."""
import json
import os
import sys

import pytest

DASHBOARDS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, DASHBOARDS)

import blockstack_dashboard  # noqa: E402


@pytest.fixture(scope="session")
def dashboard():
    """The committed dashboard JSON."""
    with open(blockstack_dashboard.OUTPUT) as f:
        return json.load(f)
