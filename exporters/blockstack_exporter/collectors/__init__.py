"""One module per kernel interface, like node_exporter's collector/ directory."""
from .dm import DmCollector
from .ext4 import Ext4Collector
from .jbd2 import Jbd2Collector
from .queue import QueueCollector
from .stack import StackCollector

ALL = {c.name: c for c in (QueueCollector, StackCollector, DmCollector, Ext4Collector, Jbd2Collector)}
