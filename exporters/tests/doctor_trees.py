"""Fixture trees for blockstack-doctor: the recorded host-loop tree, and the dm scenarios of
fixtures/dm/ (test_dm.SYSFS: names and numbers) given what a doctor reads besides dmsetup: each
device's queue/ settings and the stack edges (dm slaves/). Settings are the kernel's defaults
for such devices except where a scenario says otherwise; the incident's nomerges=2 on nvme1n1
is the write-up's (lvm-snapshot-nvme-merges.md), its max_hw_sectors_kb (256) and its namespace's
wwid (what the persist recipe's udev rule matches on) are ours.
"""

import os

from exporter_testlib import FIXTURES, HOST_LOOP
from test_dm import SYSFS, build_sysfs

QUEUE = {
    "nomerges": "0",
    "max_sectors_kb": "1280",
    "max_hw_sectors_kb": "32767",
    "read_ahead_kb": "128",
    "nr_requests": "128",
    "rotational": "0",
    "logical_block_size": "512",
    "physical_block_size": "512",
    "max_segments": "128",
    "scheduler": "none",
}
HDD = {"rotational": "1", "max_hw_sectors_kb": "32767", "scheduler": "none [mq-deadline] kyber bfq"}

# device attributes beside queue/ (the NVMe namespace's WWID: nvme_ns_id_attrs, ATTR{wwid} to udev)
ATTRS = {"nvme1n1": {"wwid": "eui.0025385b71b07e2f"}}

# scenario -> (queue settings by disk, {device: [devices directly beneath]})
SCENARIOS = {
    "nvme-incident": (
        {
            "nvme1n1": {"nomerges": "2", "max_sectors_kb": "256", "max_hw_sectors_kb": "256"},
            **{f"dm-{i}": {"max_sectors_kb": "256", "max_hw_sectors_kb": "256"} for i in range(4)},
        },
        {"dm-0": ["dm-1"], "dm-1": ["nvme1n1"], "dm-2": ["nvme1n1"], "dm-3": ["dm-1", "dm-2"]},
    ),
    "snapshot-states": (
        {"sda": HDD},
        {
            "dm-0": ["dm-1"],
            "dm-1": ["sda2"],
            "dm-2": ["sda2"],
            "dm-3": ["dm-1", "dm-2"],
            "dm-4": ["sda2"],
            "dm-5": ["dm-1", "dm-4"],
            "dm-6": ["sda3"],
            "dm-7": ["sda3"],
            "dm-8": ["dm-6", "dm-7"],
        },
    ),
    # md125 is a RAID whose 1.5 MiB stripe is the pool's data block: it reads ahead two stripes,
    # and the pool's data volume on it (dm-5) reads ahead the 128 KiB a new dm device gets
    "thin-pool": (
        {"sda": HDD, "sdb": HDD, "md125": {"rotational": "1", "read_ahead_kb": "3072"}},
        {
            "dm-0": ["sda3"],
            "dm-1": ["sda3"],
            "dm-2": ["sdb3"],
            "dm-3": ["sdb3"],
            "dm-4": ["dm-1", "dm-3"],
            "dm-5": ["md125"],
            "dm-6": ["dm-4", "dm-5"],
            "dm-7": ["dm-6"],
            "dm-8": ["dm-6"],
            "dm-9": ["dm-6"],
            "dm-10": ["dm-6"],
        },
    ),
    # an SSD under dm-crypt without the workqueue flags
    "unknown-targets": (
        {"sdb": {"scheduler": "none [mq-deadline] kyber bfq"}},
        {"dm-0": ["sdb3"], "dm-1": ["dm-0"], "dm-2": ["dm-0"], "dm-3": ["dm-0"]},
    ),
}
TREES = ("host-loop", *SCENARIOS)


def build(base, scenario):
    """(tree root, dmsetup fixtures directory or None) for one scenario."""
    if scenario == "host-loop":
        return HOST_LOOP, None
    queues, edges = SCENARIOS[scenario]
    root = build_sysfs(os.path.join(base, scenario), SYSFS[scenario])
    sysfs = os.path.join(root, "sys")
    for line in SYSFS[scenario].splitlines():
        if not line.strip():
            continue
        kind, name, devno, *_ = line.split()
        path = os.path.realpath(os.path.join(sysfs, "class", "block", name))
        with open(os.path.join(path, "dev"), "w") as f:
            f.write(devno + "\n")
        for attr, value in ATTRS.get(name, {}).items():
            with open(os.path.join(path, attr), "w") as f:
                f.write(value + "\n")
        if kind != "part":
            os.makedirs(os.path.join(path, "queue"))
            for attr, value in {**QUEUE, **queues.get(name, {})}.items():
                with open(os.path.join(path, "queue", attr), "w") as f:
                    f.write(value + "\n")
        if kind == "dm":
            os.makedirs(os.path.join(path, "slaves"))
            for low in edges.get(name, ()):
                os.symlink(
                    os.path.relpath(
                        os.path.realpath(os.path.join(sysfs, "class", "block", low)),
                        os.path.join(path, "slaves"),
                    ),
                    os.path.join(path, "slaves", low),
                )
    for d in ("proc/self", "dev"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    open(os.path.join(root, "proc/self/mountinfo"), "w").close()
    return root, os.path.join(FIXTURES, "dm", scenario)
