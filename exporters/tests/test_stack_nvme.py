"""NVMe native multipath in the stack collector: the sysfs shape Debian's 6.1 kernel shows in the VM
lab (lab/tests/test_vm_stacks.py) for one namespace shared by two controllers of one subsystem: the
head nvme8n1 (device -> nvme-subsys8, slaves/ empty) and the hidden paths nvme8c7n1, nvme8c8n1
(device -> the controllers nvme7, nvme8), all three in /sys/block; only the paths account I/O."""

import os

from exporter_testlib import Scraped, registry_for

DEVICES = {  # name: (sysfs directory under devices/, dev)
    "nvme8n1": ("virtual/nvme-subsystem/nvme-subsys8/nvme8n1", "259:6"),
    "nvme8c7n1": ("pci0000:00/0000:00:11.0/nvme/nvme7/nvme8c7n1", "259:9"),
    "nvme8c8n1": ("pci0000:00/0000:00:12.0/nvme/nvme8/nvme8c8n1", "259:5"),
    "nvme8n1p1": ("virtual/nvme-subsystem/nvme-subsys8/nvme8n1/nvme8n1p1", "259:10"),
    "nvme0n1": ("pci0000:00/0000:00:0a.0/nvme/nvme0/nvme0n1", "259:0"),
    "nvme10c1n1": (
        "pci0000:00/0000:00:13.0/nvme/nvme1/nvme10c1n1",
        "259:11",
    ),  # a path without its head
}


def tree(base):
    sys_dir = os.path.join(base, "sys")
    for name, (rel, dev) in DEVICES.items():
        d = os.path.join(sys_dir, "devices", rel)
        os.makedirs(os.path.join(d, "slaves"))
        with open(os.path.join(d, "dev"), "w") as f:
            f.write(dev + "\n")
        for link in (f"class/block/{name}", f"dev/block/{dev}"):
            os.makedirs(os.path.dirname(os.path.join(sys_dir, link)), exist_ok=True)
            os.symlink(f"../../devices/{rel}", os.path.join(sys_dir, link))
    os.makedirs(os.path.join(base, "proc/self"))
    open(os.path.join(base, "proc/self/mountinfo"), "w").close()
    return base


def test_multipath_head_sits_on_its_paths(tmp_path):
    s = Scraped(
        registry_for(tree(str(tmp_path)), "--collector.disable-defaults", "--collector.stack")
    )
    edges = sorted((e["device"], e["lower"]) for e in s.series("blockstack_device_lower_info"))
    assert edges == [("nvme8n1", "nvme8c7n1"), ("nvme8n1", "nvme8c8n1"), ("nvme8n1p1", "nvme8n1")]
    assert (
        s.get("blockstack_device_beneath_info", device="nvme8n1p1", lower="nvme8c7n1", depth="2")
        == 1
    )
    assert s.get("blockstack_device_holders", device="nvme8c7n1") == 1
    assert s.get("blockstack_device_holders", device="nvme10c1n1") == 0
    assert (
        s.get(
            "blockstack_device_info",
            device="nvme8n1",
            kind="disk",
            name="nvme8n1",
            uuid="",
            vg_name="",
            lv_name="",
            lv_layer="",
            backing_file="",
        )
        == 1
    )
    assert s.success("stack") == 1
