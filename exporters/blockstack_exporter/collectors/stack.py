"""The device stack: which devices sit directly beneath each device, and what each one is.

Edges come from the kernel alone, never from udev:
- dm and md devices list what they are built on in /sys/block/DEV/slaves/;
- a partition sits on its disk;
- a loop device sits on the block device holding its backing file
  (/sys/block/loopN/loop/backing_file, located through /proc/1/mountinfo, see devices.py);
- an NVMe native-multipath namespace nvmeSnN sits on its paths nvmeScCnN, one per controller
  (drivers/nvme/host/multipath.c names them so; the paths are hidden disks, in /sys/block and
  /proc/diskstats but not in the head's slaves/, and on 6.1 only the paths account I/O).
The identity labels are node_exporter's node_disk_device_mapper_info labels, with the values
udev gives them, so that the two join on `device` without relabelling: name and uuid from
/sys/block/dm-N/dm/{name,uuid} (udev's DM_NAME, DM_UUID); for a device whose uuid starts with
"LVM-", vg_name, lv_name and lv_layer decoded from the dm name as lvm2's udev rule does
(11-dm-lvm.rules: `dmsetup splitname` -> DM_VG_NAME, DM_LV_NAME, DM_LV_LAYER). The dm name is
VG-LV[-LAYER] with each '-' inside VG or LV doubled (lvm2 libdm dm_build_dm_name); the layer is
empty for a volume a user made (an origin, a snapshot, a thin volume) and names LVM's hidden
layer otherwise: "real" for a snapshot origin's -real device, "cow" for a snapshot's -cow,
"tpool" for a thin pool. A device that is not dm has name = its kernel name and the rest empty.
"""

import os
import re

from prometheus_client.core import GaugeMetricFamily

from .. import devices as devmod
from ..fs import ParseError, listdir
from ..scrape import Reuse, reason_of

_NVME_PATH = re.compile(
    r"^nvme(\d+)c\d+n(\d+)$", re.ASCII
)  # subsystem S, controller C, namespace N

INFO_LABELS = ["device", "kind", "name", "uuid", "vg_name", "lv_name", "lv_layer", "backing_file"]


def split_lvm_name(dm_name):
    """'vg--a-lv-real' -> ('vg-a', 'lv', 'real'), 'vg-lv' -> ('vg', 'lv', ''); None if the name
    is not VG-LV[-LAYER]."""
    parts = dm_name.split("-")
    if "--" in dm_name:  # a '-' inside VG or LV, doubled
        parts = [""]
        for i, piece in enumerate(dm_name.split("--")):
            words = piece.split("-")
            parts[-1] += "-" + words[0] if i else words[0]
            parts += words[1:]
    if len(parts) not in (2, 3) or not all(parts):
        return None
    vg, lv = parts[0], parts[1]
    return vg, lv, parts[2] if len(parts) == 3 else ""


def kind_of(dev):
    """The kernel names device-mapper devices dm-N, md arrays mdN and loop devices loopN
    (drivers/md/dm.c, drivers/md/md.c, drivers/block/loop.c), so the name tells the kind
    without another read."""
    if dev.parent:
        return "partition"
    for prefix, kind in (("dm-", "dm"), ("md", "md"), ("loop", "loop")):
        if dev.name.startswith(prefix) and dev.name[len(prefix) :].isdigit():
            return kind
    return "disk"


class StackCollector:
    name = "stack"

    def __init__(self):
        # worth 40 % of a 1024-device scrape's CPU (make bench-exporter --without reuse-stack)
        self._reuse = Reuse()
        self._part = {}, {}, {}  # the Host's devices, lower and numbers, of the families built last

    def collect(self, scrape):
        described = []
        devices = list(scrape.devices.values())
        paths = nvme_paths(scrape.devices)
        for i, dev in enumerate(devices):
            if scrape.past_deadline("the remaining devices", len(devices) - i):
                break
            labels, lower = self._describe(scrape, dev, paths)
            if labels is not None:  # else vanished
                described.append((tuple(labels), tuple(lower), self._number(scrape, dev)))
        described = tuple(described)
        families = self._reuse.families_for(scrape, described, lambda: self._build(described))
        scrape.host.devices, scrape.host.lower, scrape.host.numbers = self._part
        return families

    def _build(self, described):
        self._part = (
            {labels[0]: dict(zip(INFO_LABELS[1:], labels[1:])) for labels, _, _ in described},
            {labels[0]: list(lower) for labels, lower, _ in described},
            {labels[0]: numbers for labels, _, numbers in described if numbers},
        )
        info = GaugeMetricFamily(
            "blockstack_device_info",
            "A block device: its kind (disk, partition, dm, md, loop); name (the dm name, else the "
            "kernel name), uuid, vg_name, lv_name and lv_layer as in node_disk_device_mapper_info; "
            "a loop device's backing file (value always 1).",
            labels=INFO_LABELS,
        )
        lower_info = GaugeMetricFamily(
            "blockstack_device_lower_info",
            "An edge of the device stack: `lower` sits directly beneath `device` (value always 1).",
            labels=["device", "lower"],
        )
        beneath = GaugeMetricFamily(
            "blockstack_device_beneath_info",
            "`lower` sits somewhere beneath `device`, `depth` layers down; query "
            'blockstack_device_beneath_info{device="dm-3"} for all of dm-3\'s stack (value always 1).',
            labels=["device", "lower", "depth"],
        )
        holders = GaugeMetricFamily(
            "blockstack_device_holders",
            "Number of devices directly above this one in the stack; 0 marks the top of a stack.",
            labels=["device"],
        )
        number = GaugeMetricFamily(
            "blockstack_device_number_info",
            "A block device's number now: major_minor as in DEV/dev and /proc/partitions, devno the "
            "same encoded as stat(2)'s st_rdev, the label ebpf_exporter's series carry; the rules "
            "name those series through it (value always 1).",
            labels=["device", "major_minor", "devno"],
        )

        edges = {}
        for labels, lower, numbers in described:
            name = labels[0]
            info.add_metric(labels, 1)
            if numbers:
                number.add_metric([name, *numbers], 1)
            edges[name] = lower
            for low in lower:
                lower_info.add_metric([name, low], 1)

        above = {name: 0 for name in edges}
        for lower in edges.values():
            for low in lower:
                if low in above:
                    above[low] += 1
        for name, n in above.items():
            holders.add_metric([name], n)

        for name in edges:
            layers = devmod.layers(name, lambda d: edges.get(d, ()))
            for depth, layer in enumerate(layers[1:], 1):
                for low in layer:
                    beneath.add_metric([name, low, str(depth)], 1)
        return info, lower_info, beneath, holders, number

    @staticmethod
    def _number(scrape, dev):
        """(major_minor, devno) of a device, or None (and an error) if DEV/dev cannot be read."""
        try:
            devt = scrape.devt(dev)
        except FileNotFoundError:
            return None  # vanished between listing and reading
        except (OSError, ParseError) as e:
            scrape.error(f"{dev.name}: dev: {e}", reason_of(e), subject=f"{dev.name} dev")
            return None
        major, _, minor = devt.partition(":")
        # the kernel's dev_t: 12 bits of major, 20 of minor (include/linux/kdev_t.h MINORBITS)
        if not (
            major.isdigit() and minor.isdigit() and int(major) < 1 << 12 and int(minor) < 1 << 20
        ):
            scrape.error(
                f"{dev.name}: dev {devt[:40]!r} is not MAJOR:MINOR", subject=f"{dev.name} dev"
            )
            return None
        return f"{int(major)}:{int(minor)}", str(encode_dev(int(major), int(minor)))

    def _describe(self, scrape, dev, paths):
        kind = kind_of(dev)
        name, uuid, vg, lv, layer, backing = dev.name, "", "", "", "", ""
        lower = []
        if dev.name in paths:
            lower = paths[dev.name]
        elif kind == "partition":
            lower = [dev.parent]
        elif kind in ("dm", "md"):
            try:
                lower = sorted(listdir(f"{dev.path}/slaves"))
            except OSError as e:  # EACCES, ELOOP: no edges for this device
                scrape.error(f"{dev.name}: slaves: {e}", reason_of(e), subject=f"{dev.name} slaves")
                lower = []
            if not lower and not os.path.isdir(
                dev.path
            ):  # checked only then: one stat less per device
                scrape.error(f"{dev.name}: device vanished while being read", "vanished")
                return None, None
            if kind == "dm":
                dm_name, uuid = scrape.dm.get(dev.name, ("", ""))
                name = dm_name or dev.name
                if uuid.startswith("LVM-"):
                    decoded = split_lvm_name(name)
                    if decoded:
                        vg, lv, layer = decoded
                    else:
                        scrape.error(
                            f"{dev.name}: LVM dm name {name[:80]!r} is not VG-LV[-LAYER]",
                            subject=f"{dev.name} lvm name",
                        )
        elif kind == "loop":
            backing, low = self._loop_backing(scrape, dev)
            lower = [low] if low else []
        return [dev.name, kind, name, uuid, vg, lv, layer, backing], lower

    def _loop_backing(self, scrape, dev):
        """A loop device's backing file and the block device that holds it ('' / None if unknown)."""
        try:
            backing = scrape.backing_file(dev)
        except (OSError, ParseError) as e:
            scrape.error(
                f"{dev.name}: backing_file: {e}", reason_of(e), subject=f"{dev.name} backing_file"
            )
            return "", None
        if not backing:
            return "", None  # an unattached loop device
        path = backing[: -len(" (deleted)")] if backing.endswith(" (deleted)") else backing
        mount = devmod.mount_holding(scrape.mounts, path)
        if mount is None:
            return backing, None
        # Files on tmpfs, overlayfs or btrfs sit on anonymous device numbers (major 0):
        # no block device beneath, so no edge.
        return backing, scrape.name_of_devno(mount.majmin)


def encode_dev(major, minor):
    """A device number as the kernel's new_encode_dev() and glibc's makedev() encode it (st_rdev;
    include/linux/kdev_t.h): minor's low 8 bits, then major, then the rest of minor. The BPF
    programs key their maps by it (ebpf-configs/block.bpf.h encode_dev)."""
    return (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)


def nvme_paths(devices):
    """{'nvme8n1': ['nvme8c7n1', 'nvme8c8n1']}: each native-multipath namespace with its paths."""
    heads = {}
    for name in devices:
        m = _NVME_PATH.match(name)
        if m:
            heads.setdefault(f"nvme{m.group(1)}n{m.group(2)}", []).append(name)
    return {head: sorted(p) for head, p in heads.items() if head in devices}
