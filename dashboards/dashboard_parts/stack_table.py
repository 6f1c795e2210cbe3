"""The stack table: one row per layer of the selected stack, top first, down to the physical disk.

After the layer's own columns comes one column per queue setting whose SETTINGS row
(exporters/blockstack_exporter/settings.py) has a dashboard column, in the rows' order, and the
scheduler. A new row with a column is a new column here and in docs/dashboard.md (`make generate`):
no file of dashboards/ names the settings but for nomerges' own mapping and the scheduler's place.
"""

import string
from dataclasses import dataclass

from grafana_foundation_sdk.builders import table

from blockstack_exporter.settings import SETTINGS

from . import queries
from .common import DS, HEALTHY, INFO, WARNING
from .widgets import color_cells, mappings, merge, organize, prop, sort_by, table_q

TITLE = "The stack at a glance: layers from top to physical disk"
# pixels for the layer columns whose values are short
NARROW = {"depth": 70, "kind": 90}
# queries.LAYERS's labels, renamed and in their order, before the settings' columns
LVM_LABELS = {"vg_name": "LVM VG", "lv_name": "LVM LV", "lv_layer": "LVM layer"}
LAYER_FIELDS = ["depth", "device", "name", "kind", *LVM_LABELS.values()]
# The active I/O scheduler is no number but a label of blockstack_queue_scheduler_info: its column
# follows this setting's.
SCHEDULER_AFTER = "max_hw_sectors_kb"
# nomerges' values; queries.plus_10_beneath adds 10 beneath a stack, where its check warns
# (nomerges_beneath_stack), elsewhere it only informs (nomerges)
NOMERGES_TEXTS = ((0, "0 · all merges"), (1, "1 · simple only"), (2, "2 · no merges"))


@dataclass(frozen=True)
class TableColumn:
    header: str
    expr: str
    properties: tuple  # of the column's field override (none: no override)
    doc: str  # docs/dashboard.md: what the cell shows and in which colours
    label: bool = False  # the cell is the query's label named `header`, not its value


def shown(value, divisor):
    """A value in base units as the column shows it."""
    return value // divisor if value % divisor == 0 else value / divisor


def setting_column(row, k):
    c = row.column
    doc = f"`{row.name}`" + (f" / {c.divisor}" if c.divisor != 1 else "")
    floor = c.healthy_from
    if isinstance(floor, str):
        doc += f"; {INFO} (info) below `{floor}`"
        floor = k[floor]
    elif floor is not None:
        doc += f"; {INFO} (info) below {floor} bytes"
    if floor is not None:
        floor = shown(floor, c.divisor)
        doc += f" ({floor}), {HEALTHY} from it"
    properties = []
    if c.texts:
        colour = {
            v: "text" if floor is None else HEALTHY if v >= floor else INFO for v, _ in c.texts
        }
        properties.append(mappings({v: (text, colour[v]) for v, text in c.texts}))
        doc += "; " + ", ".join(f'{v} shows "{text}"' for v, text in c.texts)
    if floor is not None:
        steps = [{"value": None, "color": INFO}, {"value": floor, "color": HEALTHY}]
        properties += [prop("thresholds", {"mode": "absolute", "steps": steps}), color_cells()]
    return TableColumn(row.file, queries.setting(row, k), tuple(properties), doc)


def nomerges_column(row, k):
    colours = {
        beneath + n: (text, HEALTHY if n == 0 else WARNING if beneath else INFO)
        for beneath in (0, 10)
        for n, text in NOMERGES_TEXTS
    }
    return TableColumn(
        row.file,
        queries.plus_10_beneath(queries.setting(row, k), k),
        (mappings(colours), color_cells()),
        f"`{row.name}`, plus 10 on a device beneath another one; 0 {HEALTHY}, 1 and 2 {WARNING} "
        f"(warning) beneath a stack, {INFO} (info) elsewhere",
    )


def columns(k):
    """The settings' columns in their order, the scheduler after SCHEDULER_AFTER's."""
    out = []
    for row in SETTINGS:
        if row.column is not None:
            make = nomerges_column if row.file == "nomerges" else setting_column
            out.append(make(row, k))
        if row.file == SCHEDULER_AFTER:
            out.append(
                TableColumn(
                    "scheduler",
                    queries.scheduler(k),
                    (),
                    "the `scheduler` label of `blockstack_queue_scheduler_info` (the active one)",
                    label=True,
                )
            )
    return out


def docs(k):
    """docs/dashboard.md's table of the settings' columns."""
    rows = [f"| {c.header} | {c.doc} |\n" for c in columns(k)]
    return "| Column | Shows |\n|---|---|\n" + "".join(rows)


def stack_table(k):
    cols = columns(k)
    refs = string.ascii_uppercase[1 : len(cols) + 1]  # A: the layers
    p = (
        table.Panel()
        .title(TITLE)
        .datasource(DS)
        .span(24)
        .height(7)
        .description(
            "One row per layer of the selected stack, top (depth 0) first, down to the physical "
            "disk. name is the dm name (LVM VG-LV[-layer]) for device-mapper devices. Cells take "
            "the colour of the finding the setting makes (the Findings table): orange (warning) "
            "for nomerges beneath a stack, blue (info) for nomerges on a device nothing is "
            "stacked on or a max_sectors_kb below 128; red is for pages only. Healthy: nomerges 0 "
            "on every layer and max_sectors_kb >= 128 (the NVMe incident's healthy reads went "
            "down as 512-sector = 256 KiB requests). Sick: nomerges 2 on a lower layer (Ubuntu "
            "4.4 set QUEUE_FLAG_NOMERGES on nvme1n1; the fix was `echo 0 > "
            "/sys/block/nvme1n1/queue/nomerges`), or a tiny max_sectors_kb (4 KiB splits every "
            "request into single pages). rotational 1 means a spinning disk, where a snapshot's "
            "COW syncs cost seeks (LVM2 write-up: writes 20-30x slower)."
        )
        .with_target(table_q(queries.LAYERS, "A"))
    )
    for ref, c in zip(refs, cols):
        p = p.with_target(table_q(c.expr, ref))
    p = (
        p.no_value(
            "No device: this stack has no layer blockstack-exporter knows (pick a stack above)"
        )
        .with_transformation(merge())
        .with_transformation(
            organize(
                exclude=["Time", "host", "Value #A"]
                + [f"Value #{ref}" for ref, c in zip(refs, cols) if c.label],
                rename={f"Value #{ref}": c.header for ref, c in zip(refs, cols) if not c.label}
                | LVM_LABELS,
                order=LAYER_FIELDS + [c.header for c in cols],
            )
        )
        .with_transformation(sort_by("depth"))
    )
    for c in cols:
        if c.properties:
            p = p.override_by_name(c.header, list(c.properties))
    # Narrow the short layer columns, so that every setting's column fits the panel's width
    # at 1500 px (read_ahead_kb pushed rotational out of sight)
    for field, width in NARROW.items():
        p = p.override_by_name(field, [prop("custom.width", width)])
    return [p]
