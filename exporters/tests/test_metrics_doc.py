"""docs/metrics.md is what exporters/tools/metrics_doc.py generates from the exporters today: a
metric, HELP string, label or ebpf-configs YAML changed without `make metrics-doc` fails here."""

import os
import subprocess
import sys

from exporter_testlib import HERE

GENERATOR = os.path.join(os.path.dirname(HERE), "tools", "metrics_doc.py")


def test_metrics_doc_is_current():
    r = subprocess.run(
        [sys.executable, GENERATOR, "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=HERE),
    )
    assert r.returncode == 0, r.stdout + r.stderr
