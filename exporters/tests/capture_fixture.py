#!/usr/bin/env python3
"""Capture the parts of a live sysfs/procfs/dev that blockstack-exporter reads into a fixture tree.

    capture_fixture.py OUT_DIR [DEVICE ...]

Symlinks are kept as links (relative, as the kernel shows them), files byte for byte (a missing
trailing newline stays missing), and of each ext4 device only its first 2 KiB (the superblock).
Run it as root on a real machine, then commit OUT_DIR; update the golden output with
`make update-fixtures`.
"""

import os
import shutil
import sys

from blockstack_exporter.collectors.queue import FILES as QUEUE_FILES

DEVICE_FILES = ("dev", "size", "partition", "dm/name", "dm/uuid", "loop/backing_file")


def copy_file(src, dst):
    try:
        with open(src, "rb") as f:
            data = f.read()
    except OSError:
        return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "wb") as f:
        f.write(data)


def copy_link(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.lexists(dst):
        os.unlink(dst)
    os.symlink(os.readlink(src), dst)


def capture(out, wanted):
    sys_out = os.path.join(out, "sys")
    for name in sorted(os.listdir("/sys/class/block")):
        if wanted and name not in wanted and not any(name.startswith(w) for w in wanted):
            continue
        link = os.path.join("/sys/class/block", name)
        copy_link(link, os.path.join(sys_out, "class/block", name))
        real = os.path.realpath(link)
        rel = os.path.relpath(real, "/sys")
        for f in DEVICE_FILES:
            copy_file(os.path.join(real, f), os.path.join(sys_out, rel, f))
        for d in ("slaves", "holders"):
            for entry in (
                sorted(os.listdir(os.path.join(real, d)))
                if os.path.isdir(os.path.join(real, d))
                else ()
            ):
                copy_link(os.path.join(real, d, entry), os.path.join(sys_out, rel, d, entry))
        if os.path.isdir(os.path.join(real, "queue")):
            for f in QUEUE_FILES:
                copy_file(os.path.join(real, "queue", f), os.path.join(sys_out, rel, "queue", f))
            copy_link(os.path.join("/sys/block", name), os.path.join(sys_out, "block", name))
        with open(os.path.join(real, "dev")) as f:
            majmin = f.read().strip()
        copy_link(
            os.path.join("/sys/dev/block", majmin), os.path.join(sys_out, "dev/block", majmin)
        )

    proc_out = os.path.join(out, "proc")
    # the mounts the exporter reads (devices.read_mountinfo: pid 1's, else its own), kept at
    # self/mountinfo, which the exporter reads when the tree has no 1/
    mountinfo = "/proc/1/mountinfo" if os.access("/proc/1/mountinfo", os.R_OK) else None
    copy_file(mountinfo or "/proc/self/mountinfo", os.path.join(proc_out, "self/mountinfo"))
    copy_file("/proc/diskstats", os.path.join(proc_out, "diskstats"))
    for fs, leaf in (("ext4", "options"), ("jbd2", "info")):
        base = os.path.join("/proc/fs", fs)
        for entry in sorted(os.listdir(base)) if os.path.isdir(base) else ():
            copy_file(
                os.path.join(base, entry, leaf), os.path.join(proc_out, "fs", fs, entry, leaf)
            )
            if fs == "ext4":
                try:
                    with open(os.path.join("/dev", entry), "rb") as f:
                        head = f.read(2048)
                except OSError:
                    continue
                os.makedirs(os.path.join(out, "dev"), exist_ok=True)
                with open(os.path.join(out, "dev", entry), "wb") as f:
                    f.write(head)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    if os.path.exists(out):
        shutil.rmtree(out)
    capture(out, set(sys.argv[2:]))
