"""The exporter given the host's /proc but not its devices (a pod, issue 42): the mounts it reads
are pid 1's, and the ext4 journal size is derived from procfs where /dev/DEV is absent."""

import os
import shutil

import pytest
from exporter_testlib import Scraped, registry_for

from blockstack_exporter.collectors.ext4 import (
    journal_bytes_from_limits,
    journal_bytes_from_proc,
    kernel_fraction,
    parse_block_size,
)
from blockstack_exporter.devices import read_mountinfo
from blockstack_exporter.fs import ParseError

HOST_MOUNT = "25 1 7:0 / /mnt/host rw,relatime shared:1 - ext4 /dev/loop0 rw\n"
OWN_MOUNT = "25 1 7:0 / /mnt/container rw,relatime shared:1 - ext4 /dev/loop0 rw\n"


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


# --- mounts: pid 1's, else self's ---------------------------------------------------------------


def test_mountinfo_of_pid_1_wins_over_self(tmp_path):
    write(tmp_path, "1/mountinfo", HOST_MOUNT)
    write(tmp_path, "self/mountinfo", OWN_MOUNT)
    mounts, bad = read_mountinfo(str(tmp_path))
    assert [m.mountpoint for m in mounts] == ["/mnt/host"] and bad == 0


def test_mountinfo_of_self_when_the_tree_has_no_pid_1(tmp_path):
    write(tmp_path, "self/mountinfo", OWN_MOUNT)
    mounts, _ = read_mountinfo(str(tmp_path))
    assert [m.mountpoint for m in mounts] == ["/mnt/container"]


def test_mountinfo_of_self_when_pid_1s_is_unreadable(tmp_path):
    os.makedirs(tmp_path / "1" / "mountinfo")  # a directory: open() then read() fails (EISDIR)
    write(tmp_path, "self/mountinfo", OWN_MOUNT)
    mounts, _ = read_mountinfo(str(tmp_path))
    assert [m.mountpoint for m in mounts] == ["/mnt/container"]


def test_without_either_mountinfo_one_error_names_both(tmp_path):
    with pytest.raises(FileNotFoundError) as e:  # still counted as "vanished", as before
        read_mountinfo(str(tmp_path))
    assert "1/mountinfo" in str(e.value) and "self/mountinfo" in str(e.value)


# --- the block size from mb_structs_summary -----------------------------------------------------


def order_lines(orders):
    return "".join(f"\tlist_order_{i}_groups: {i % 3}\n" for i in range(orders))


def structs_summary(orders):
    """The file as 6.18 writes it (fs/ext4/mballoc.c ext4_mb_seq_structs_summary_show) for a
    filesystem with `orders` buddy orders."""
    lines = order_lines(orders)
    return f"optimize_scan: 1\nmax_free_order_lists:\n{lines}avg_fragment_size_lists:\n{lines}"


def test_block_size_is_two_to_the_orders_less_two():
    # measured on 6.18: 12 lines for 1 KiB blocks, 14 for 4 KiB
    assert parse_block_size(structs_summary(12)) == 1024
    assert parse_block_size(structs_summary(14)) == 4096
    # as 5.13 wrote it (the patch that added the file): a fragment_size_tree section last
    tree = "fragment_size_tree:\n\ttree_min: 0\n\ttree_max: 0\n\ttree_nodes: 0\n"
    assert (
        parse_block_size(f"optimize_scan: 0\nmax_free_order_lists:\n{order_lines(14)}{tree}")
        == 4096
    )


@pytest.mark.parametrize(
    "text",
    [
        "",  # no section
        "optimize_scan: 1\nmax_free_order_lists:\n",  # no orders
        structs_summary(11),  # fewer than 1 KiB blocks have
        structs_summary(19),  # more than 64 KiB blocks have
        structs_summary(14).replace("list_order_5_", "list_order_6_", 1),  # a gap
    ],
)
def test_block_size_from_a_file_that_is_not_the_kernels_is_a_parse_error(text):
    with pytest.raises(ParseError):
        parse_block_size(text)


# --- the journal's size from jbd2's transaction cap ---------------------------------------------


@pytest.mark.parametrize(
    "max_blocks, block_size, fraction, journal",
    [
        (2730, 1024, 3, 8 << 20),  # measured on 6.18: an 8 MiB journal of 1 KiB blocks
        (1365, 4096, 3, 16 << 20),  # measured on 6.18: 16 MiB of 4 KiB blocks
        (1365, 1024, 3, 4 << 20),  # 4096 blocks // 3
        (5461, 4096, 3, 64 << 20),  # 16384 blocks // 3
        (1024, 1024, 4, 4 << 20),  # before 6.11: a quarter (a third of 3 MiB fits too)
        (4096, 4096, 4, 64 << 20),
        (4096, 4096, 3, 48 << 20),  # the same cap on 6.11+: 48 MiB
        (2730, 1024, None, 8 << 20),  # release unknown: a quarter fits no whole MiB here
        (1365, 4096, 4, 16 << 20),  # a third on a release that says a quarter (a backport)
    ],
)
def test_journal_size_from_the_transaction_cap(max_blocks, block_size, fraction, journal):
    assert journal_bytes_from_limits(max_blocks, block_size, fraction) == journal


@pytest.mark.parametrize(
    "max_blocks, block_size, fraction",
    [
        (1000, 1024, 3),  # 3000 to 3002 or 4000 to 4003 blocks: no whole MiB
        (1001, 4096, 4),
        (256, 4096, None),  # 3 MiB on 6.11+, 4 MiB before: which one is not known
        (0, 4096, 3),
    ],
)
def test_a_cap_that_fits_no_single_whole_mib_journal_gives_no_size(
    max_blocks, block_size, fraction
):
    with pytest.raises(ParseError):
        journal_bytes_from_limits(max_blocks, block_size, fraction)


def test_the_fraction_follows_the_kernel_release():
    assert kernel_fraction("6.18.44-fc-v669") == 3
    assert kernel_fraction("6.11.0") == 3
    assert kernel_fraction("6.10.14") == 4
    assert kernel_fraction("6.1.0-28-amd64") == 4
    assert kernel_fraction("5.10.0-33-amd64") == 4
    assert kernel_fraction("") is None


def proc_tree(root, device="loop1", max_blocks=2730, orders=12, release="6.18.44\n"):
    write(
        root,
        f"fs/jbd2/{device}-8/info",
        f"6 transactions (6 requested), each up to {max_blocks} blocks\n",
    )
    if orders:
        write(root, f"fs/ext4/{device}/mb_structs_summary", structs_summary(orders))
    if release:
        write(root, "sys/kernel/osrelease", release)
    return str(root)


def test_journal_size_from_a_proc_tree(tmp_path):
    procfs = proc_tree(tmp_path)
    names = os.listdir(os.path.join(procfs, "fs", "jbd2"))
    assert journal_bytes_from_proc(procfs, "loop1", names) == 8 << 20


def test_a_5_10_kernel_without_mb_structs_summary_gives_no_size(tmp_path):
    procfs = proc_tree(tmp_path, orders=0, release="5.10.0-33-amd64\n")
    with pytest.raises(FileNotFoundError):
        journal_bytes_from_proc(procfs, "loop1", os.listdir(os.path.join(procfs, "fs", "jbd2")))


def test_no_jbd2_journal_of_the_device_gives_no_size(tmp_path):
    procfs = proc_tree(tmp_path, device="loop0")
    os.makedirs(tmp_path / "fs" / "ext4" / "loop1")
    with pytest.raises(ParseError):
        journal_bytes_from_proc(procfs, "loop1", ["loop0-8"])


# --- the collector: superblock where /dev/DEV opens, procfs where it does not -------------------


def test_collector_derives_the_size_without_the_device_and_says_why_not(host_tree):
    """The host-loop tree (6.18, loop1 with an 8 MiB journal of 1 KiB blocks, jbd2 cap 2730)
    without its dev/: loop1's size comes from procfs, equal to the superblock's; loop0, whose
    tree lacks mb_structs_summary, has none and one error saying both reasons."""
    with_dev = Scraped(registry_for(host_tree))
    write(host_tree, "proc/fs/ext4/loop1/mb_structs_summary", structs_summary(12))
    write(host_tree, "proc/sys/kernel/osrelease", "6.18.44-fc-v669\n")
    shutil.rmtree(os.path.join(host_tree, "dev"))
    os.makedirs(os.path.join(host_tree, "dev"))
    registry = registry_for(host_tree)
    s = Scraped(registry)
    loop1 = {"device": "loop1", "mountpoint": "/mnt/blockstack-upper"}
    assert s.get("blockstack_ext4_journal_size_bytes", **loop1) == 8 << 20
    assert with_dev.get("blockstack_ext4_journal_size_bytes", **loop1) == 8 << 20
    assert [
        x for x in s.series("blockstack_ext4_journal_size_bytes") if x["device"] != "loop1"
    ] == []
    # loop0 and vda: no size, counted as before (no device: vanished)
    assert s.errors("ext4", "vanished") == 2 and s.errors("ext4") == 2
