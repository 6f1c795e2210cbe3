"""Every test directory's common rule: a test marked `root` fails, never skips, without root."""
import os

import pytest


def pytest_runtest_setup(item):
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.fail("needs root (loop devices, mounts, BPF, sysfs writes): run it as root; "
                    "`make test-unit` runs the tests that do not", pytrace=False)
