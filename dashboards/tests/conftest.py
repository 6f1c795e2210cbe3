"""Fixtures of the dashboard tests."""

import json

import pytest

import blockstack_dashboard


@pytest.fixture(scope="session")
def dashboard():
    """The committed dashboard JSON."""
    with open(blockstack_dashboard.OUTPUT) as f:
        return json.load(f)
