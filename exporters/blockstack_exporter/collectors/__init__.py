"""One module per kernel interface, like node_exporter's collector/ directory."""

from .dm import DmCollector
from .ebpf import EbpfCollector
from .ext4 import Ext4Collector
from .findings import FindingsCollector
from .jbd2 import Jbd2Collector
from .queue import QueueCollector
from .stack import StackCollector

# findings last: it judges what the others read in the same scrape
ALL = {
    c.name: c
    for c in (
        QueueCollector,
        StackCollector,
        DmCollector,
        Ext4Collector,
        Jbd2Collector,
        EbpfCollector,
        FindingsCollector,
    )
}


def build(
    names,
    knobs=None,
    dmsetup="dmsetup",
    dm_timeout=5.0,
    dm_helper=None,
    ebpf_status=None,
    dev="/dev",
):
    """The collectors named, in ALL's order (findings last), as the exporter's and the doctor's
    flags configure them: knobs are the findings' thresholds (knobs.load), dev --path.dev."""
    options = {
        "dm": {"dmsetup": dmsetup, "timeout": dm_timeout, "helper": dm_helper, "dev": dev},
        "findings": {"knobs": knobs},
        "ebpf": {"status_file": ebpf_status},
    }
    return [ALL[name](**options.get(name, {})) for name in ALL if name in names]
