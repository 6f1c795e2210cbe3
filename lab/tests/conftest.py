"""Prerequisites of the lab tests: fail (not skip) with what is missing and how to get it."""

import pytest

from blockstack_lab import cli


@pytest.fixture
def lab_prerequisites():
    problems = cli.missing_requirements()
    if problems:
        pytest.fail("the lab tests need: " + "; ".join(problems))
