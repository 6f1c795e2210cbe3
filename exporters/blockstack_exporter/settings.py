"""Every queue setting the project reads, one row each: the collector, the checks, the doctor
(its collapse evidence and persist scan), the recording rules, the dashboard's stack table and
the docs all read this table (a new setting is a new row here, plus its check if it has one).

A setting has one name everywhere: its file in /sys/block/DEV/queue/ (Documentation/ABI/stable/
sysfs-block). Values are held in base units (bytes) from the moment they are parsed. Code that
means one setting imports its row by name (`from .settings import NOMERGES`): a typo fails at
import.
"""

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class Column:
    """The setting's column in the dashboard's stack table, after the device's own columns."""

    divisor: int = 1  # the cell shows the metric divided by this (KiB files: 1024)
    # A knob of alerts/config.yml, in base units: cells below it are blue (info, the colour of
    # the finding the setting then makes), from it green. None: no colour.
    healthy_from: str | None = None
    texts: tuple = ()  # ((value, text), ...): the cell's text for these values


@dataclass(frozen=True)
class Setting:
    file: str  # in /sys/block/DEV/queue/; also the setting's name in checks, doctor and dashboard
    metric: str  # blockstack_queue_<metric>, in base units
    help: str
    scale: int = 1  # the file's value times this is the metric's (KiB files: 1024)
    fixed: bool = False  # the driver's limit: read again only when the device's identity changes
    column: Column | None = None  # None: not in the dashboard's stack table
    # the file lists the choices with the active one in brackets ('none [mq-deadline] kyber'): held
    # as text, published as blockstack_queue_<metric>{<file>="active"} 1; else a number
    choice: bool = False
    tuned: str | None = None  # tuned's [disk] option that writes it (tuned/plugins/plugin_disk.py)
    collapse: bool = False  # shown in the merge collapse finding's evidence (its fix changes it)
    # a label of host_device:blockstack_queue_settings:info (alerts/src/recording.rules.yml.in),
    # in the file's unit, for the collapse page's annotations
    info_label: bool = False

    @property
    def name(self):
        return "blockstack_queue_" + self.metric

    def in_file(self, value):
        """A value in base units as the file writes it (bytes -> KiB for a _kb file)."""
        return value / self.scale

    def shown(self, value):
        """The value as text, as the file writes it: '4' for 4096 bytes of a _kb file."""
        return value if self.choice else f"{self.in_file(value):.0f}"


NOMERGES = Setting(
    "nomerges",
    "nomerges",
    "Request merging: 0 all merges enabled, 1 only simple one-hit merges, 2 no merges.",
    column=Column(),
    collapse=True,
    info_label=True,
)
MAX_SECTORS_KB = Setting(
    "max_sectors_kb",
    "max_sectors_bytes",
    "Largest request the block layer builds for the device (max_sectors_kb), in bytes.",
    scale=KIB,
    column=Column(divisor=KIB, healthy_from="max_sectors_floor_bytes"),
    collapse=True,
    info_label=True,
)
MAX_HW_SECTORS_KB = Setting(
    "max_hw_sectors_kb",
    "max_hw_sectors_bytes",
    "Largest request the device's driver accepts (max_hw_sectors_kb), in bytes.",
    scale=KIB,
    fixed=True,
    column=Column(divisor=KIB),
    info_label=True,
)
READ_AHEAD_KB = Setting(
    "read_ahead_kb",
    "read_ahead_bytes",
    "Read-ahead window, in bytes.",
    scale=KIB,
    column=Column(divisor=KIB),
    tuned="readahead",
)
NR_REQUESTS = Setting(
    "nr_requests",
    "nr_requests",
    "Requests that may be allocated per queue (per hardware queue for blk-mq).",
)
ROTATIONAL = Setting(
    "rotational",
    "rotational",
    "Whether the device is rotational (1) or not (0).",
    column=Column(texts=((0, "0 · non-rotational"), (1, "1 · spinning"))),
)
LOGICAL_BLOCK_SIZE = Setting(
    "logical_block_size",
    "logical_block_size_bytes",
    "Smallest unit the device can address, in bytes.",
    fixed=True,
)
PHYSICAL_BLOCK_SIZE = Setting(
    "physical_block_size",
    "physical_block_size_bytes",
    "Smallest unit the device writes without read-modify-write, in bytes.",
    fixed=True,
)
MAX_SEGMENTS = Setting(
    "max_segments",
    "max_segments",
    "Most scatter/gather segments in one request.",
    fixed=True,
)
SCHEDULER = Setting(
    "scheduler",
    "scheduler_info",
    "The active I/O scheduler of the device's queue (value always 1).",
    choice=True,
    tuned="elevator",
)
# The table, in the collector's (and the metrics') order
QUEUE = (
    NOMERGES,
    MAX_SECTORS_KB,
    MAX_HW_SECTORS_KB,
    READ_AHEAD_KB,
    NR_REQUESTS,
    ROTATIONAL,
    LOGICAL_BLOCK_SIZE,
    PHYSICAL_BLOCK_SIZE,
    MAX_SEGMENTS,
    SCHEDULER,
)
SETTINGS = tuple(s for s in QUEUE if not s.choice)  # the numbers: one gauge per device each
BY_FILE = {s.file: s for s in QUEUE}
