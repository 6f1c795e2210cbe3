import shutil

import pytest
from exporter_testlib import HOST_LOOP


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite exporters/tests/e2e-output.txt"
    )


@pytest.fixture
def host_tree(tmp_path):
    """A private copy of the host-loop fixture tree that a test may damage."""
    dst = tmp_path / "tree"
    shutil.copytree(HOST_LOOP, dst, symlinks=True)
    return str(dst)
