"""Fixtures for the ebpf_exporter config tests: a built tree and one running exporter."""

import os

import pytest
from ebpf_testlib import CONFIG_DIR, EXPORTER, config_names, running_exporter, selected_configs


@pytest.fixture(autouse=True)
def built(request):
    """The objects every test reads (`make ebpf-objects`, no root); the tests marked root also
    load them with ebpf_exporter (`make ebpf-build`)."""
    needed = [
        os.path.join(CONFIG_DIR, n + ext) for n in config_names() for ext in (".yaml", ".bpf.o")
    ]
    target = "ebpf-objects"
    if request.node.get_closest_marker("root"):
        needed, target = [EXPORTER] + needed, "ebpf-build"
    missing = [p for p in needed if not os.path.exists(p)]
    if missing:
        pytest.fail(f"not built (run `make {target}`): {', '.join(missing)}")


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    """The real ebpf_exporter with every config this kernel loads, on a free loopback port;
    stopped (process group killed, programs detached) when the module's tests are done."""
    log = tmp_path_factory.mktemp("ebpf_exporter") / "ebpf_exporter.log"
    with running_exporter(selected_configs(), log) as running:
        yield running
