"""Fixtures for the ebpf_exporter config tests: a built tree and one running exporter."""
import os

import pytest

from blockstack_deploy import procs
from ebpf_testlib import (CONFIG_DIR, EXPORTER, EXPORTER_ENV, Exporter, config_names,
                          selected_configs)


@pytest.fixture(autouse=True)
def built(request):
    """The objects every test reads (`make ebpf-objects`, no root); the tests marked root also
    load them with ebpf_exporter (`make ebpf-build`)."""
    needed = [os.path.join(CONFIG_DIR, n + ext) for n in config_names() for ext in (".yaml", ".bpf.o")]
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
    names = selected_configs()
    port = procs.free_port()
    log = tmp_path_factory.mktemp("ebpf_exporter") / "ebpf_exporter.log"
    argv = [EXPORTER, f"--config.dir={CONFIG_DIR}", f"--config.names={names}",
            f"--web.listen-address=127.0.0.1:{port}"]
    url = f"http://127.0.0.1:{port}/metrics"
    with procs.running(argv, env=EXPORTER_ENV, health_url=url, log_path=str(log), timeout=60):
        yield Exporter(url)


