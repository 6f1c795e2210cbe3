"""The chart's tests import podkit (beside them), the chart's tools (charts/tools/) and
ebpf-configs/tests/ebpf_testlib.py (settle: block_io's counts flushed on every CPU)."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "charts", "tools"))
sys.path.insert(0, os.path.join(REPO, "ebpf-configs", "tests"))
