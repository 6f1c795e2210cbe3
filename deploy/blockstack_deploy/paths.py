"""Where the stack's files are, in one place. Each is an input (an environment variable) whose
default is this checkout, so that `make up` needs none and an installed package is told:

    BLOCKSTACK_HOME   the project's files the stack runs from: alerts/ (rules, Alertmanager
                      configuration, the receiver), dashboards/, deploy/grafana/, ebpf-configs/
                      (default: the checkout this package sits in)
    BLOCKSTACK_BUILD  the programs `make` builds: ebpf_exporter and the BPF objects, Thanos,
                      Prometheus 3, Grafana unpacked (default: BLOCKSTACK_HOME/.build)
    SHARED_DIR        where ../shared/grafana's tarball is (default: beside BLOCKSTACK_HOME)

    BLOCKSTACK_BIN    where blockstack-exporter is (default: beside the interpreter running this)
    BLOCKSTACK_GRAFANA=none  run no Grafana even where one is found (the Debian package: Grafana is
                      not in Debian; its dashboard JSON ships for import)

The state directory (rendered configuration, data, logs) is stackctl's --state. The Python
programs (blockstack-exporter, supervisord, the receiver's interpreter) are the ones installed
beside the interpreter that runs this package; where no `python` is beside it (Debian's
/usr/bin/python3, the Debian package: packaging/), that interpreter itself runs the servers.
"""

import os
import sys

REPO = os.path.abspath(
    os.environ.get("BLOCKSTACK_HOME") or os.path.join(os.path.dirname(__file__), "..", "..")
)
BUILD = os.path.abspath(os.environ.get("BLOCKSTACK_BUILD") or os.path.join(REPO, ".build"))
SHARED = os.path.abspath(os.environ.get("SHARED_DIR") or os.path.join(REPO, "..", "shared"))
VENV_BIN = os.environ.get("BLOCKSTACK_BIN") or os.path.dirname(sys.executable)
# The interpreter of the stack's Python servers (page receiver, dm helper, metrics front).
PYTHON = os.path.join(VENV_BIN, "python")
if not os.access(PYTHON, os.X_OK):
    PYTHON = sys.executable
