"""One module per kernel interface, like node_exporter's collector/ directory."""

from .dm import DmCollector
from .ebpf import EbpfCollector
from .ext4 import Ext4Collector
from .findings import FindingsCollector
from .jbd2 import Jbd2Collector
from .queue import QueueCollector
from .stack import StackCollector

# findings last: it judges what the others yielded in the same scrape
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
