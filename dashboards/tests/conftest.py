"""Fixtures of the dashboard tests."""
import json

import blockstack_dashboard
import pytest


@pytest.fixture(scope="session")
def dashboard():
    """The committed dashboard JSON."""
    with open(blockstack_dashboard.OUTPUT) as f:
        return json.load(f)
