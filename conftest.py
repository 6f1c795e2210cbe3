"""Every test directory's common rules: a test marked `root` fails, never skips, without root; a
case run with the servers built from the Go module proxy (a `servers` parameter "upstream", as
blockstack_deploy.stack.SERVERS names them) is marked `built`, so `make test-unit` needs no Go build."""
import os

import pytest
from hypothesis import settings

# Property tests check results, not speed: hypothesis' default 200 ms deadline per example made them
# fail as "flaky" whenever the 2-core machine was busy with the servers and VM tests beside them.
settings.register_profile("blockstack", deadline=None)
settings.load_profile("blockstack")


def pytest_runtest_setup(item):
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.fail("needs root (loop devices, mounts, BPF, sysfs writes): run it as root; "
                    "`make test-unit` runs the tests that do not", pytrace=False)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("servers") == "upstream":
            item.add_marker(pytest.mark.built)
