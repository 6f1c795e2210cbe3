"""Collectors on the host-loop fixture: a tree captured on a real machine (kernel 6.18) with
loop1 on a file on ext4 on loop0 (loop0 nomerges=2, max_sectors_kb=4), ext4 on loop1 mounted
dioread_lock,nodelalloc,commit=10, a partitioned loop2, and the host's vda and zram0."""

import os

from exporter_testlib import HOST_LOOP, Scraped, full_tree, registry_for

from blockstack_exporter.collectors import stack


def value(metric, **labels):
    return registry_for(HOST_LOOP).get_sample_value(metric, labels)


def test_queue_settings_in_base_units():
    assert value("blockstack_queue_nomerges", device="loop0") == 2
    assert value("blockstack_queue_nomerges", device="loop1") == 0
    assert value("blockstack_queue_max_sectors_bytes", device="loop0") == 4 * 1024
    assert value("blockstack_queue_max_hw_sectors_bytes", device="loop0") == 1280 * 1024
    assert value("blockstack_queue_logical_block_size_bytes", device="vda") == 512
    assert value("blockstack_queue_scheduler_info", device="loop1", scheduler="none") == 1
    assert value("blockstack_queue_scheduler_info", device="vda", scheduler="mq-deadline") == 1


def test_partition_reports_its_disks_queue():
    registry = registry_for(HOST_LOOP)
    for metric in (
        "blockstack_queue_nomerges",
        "blockstack_queue_max_sectors_bytes",
        "blockstack_queue_read_ahead_bytes",
        "blockstack_queue_nr_requests",
    ):
        disk = registry.get_sample_value(metric, {"device": "loop2"})
        assert disk is not None
        assert registry.get_sample_value(metric, {"device": "loop2p1"}) == disk


def test_stack_edges_follow_loop_backing_files_and_partitions():
    assert value("blockstack_device_lower_info", device="loop1", lower="loop0") == 1
    assert value("blockstack_device_lower_info", device="loop2p1", lower="loop2") == 1
    # loop1 -> loop0 -> vda (loop0's backing file lives on the root filesystem)
    assert value("blockstack_device_beneath_info", device="loop1", lower="loop0", depth="1") == 1
    assert value("blockstack_device_beneath_info", device="loop1", lower="vda", depth="2") == 1
    assert value("blockstack_device_holders", device="loop1") == 0
    assert value("blockstack_device_holders", device="loop0") == 1
    assert (
        value(
            "blockstack_device_info",
            device="loop2p1",
            kind="partition",
            name="loop2p1",
            uuid="",
            vg_name="",
            lv_name="",
            lv_layer="",
            backing_file="",
        )
        == 1
    )


def test_ext4_effective_options():
    assert (
        value("blockstack_ext4_dioread_nolock", device="loop0", mountpoint="/mnt/blockstack-lower")
        == 1
    )
    assert (
        value("blockstack_ext4_dioread_nolock", device="loop1", mountpoint="/mnt/blockstack-upper")
        == 0
    )
    assert (
        value("blockstack_ext4_delalloc", device="loop1", mountpoint="/mnt/blockstack-upper") == 0
    )
    assert (
        value(
            "blockstack_ext4_commit_interval_seconds",
            device="loop1",
            mountpoint="/mnt/blockstack-upper",
        )
        == 10
    )
    assert (
        value(
            "blockstack_ext4_option_info",
            device="loop0",
            mountpoint="/mnt/blockstack-lower",
            option="data",
            value="ordered",
        )
        == 1
    )
    # mkfs.ext4 -J size=8 on loop1: 8 MiB journal, read from the superblock's journal inode backup
    assert (
        value(
            "blockstack_ext4_journal_size_bytes", device="loop1", mountpoint="/mnt/blockstack-upper"
        )
        == 8 << 20
    )


def test_jbd2_statistics_in_base_units():
    labels = dict(device="loop0", journal="loop0-8")
    assert value("blockstack_jbd2_transactions_total", **labels) == 6
    assert value("blockstack_jbd2_transaction_max_blocks", **labels) == 2730
    assert (
        value("blockstack_jbd2_transaction_phase_average_seconds", phase="running", **labels)
        == 0.004
    )
    assert value("blockstack_jbd2_commit_average_seconds", **labels) == 0.001672
    assert value("blockstack_jbd2_logged_blocks_per_transaction", **labels) == 5


def test_every_collector_succeeds_on_the_fixture():
    for name in ("queue", "stack", "dm", "ext4", "jbd2"):
        assert value("blockstack_scrape_collector_success", collector=name) == 1


def test_dm_identity_labels_are_node_exporters(tmp_path):
    """name, uuid, vg_name, lv_name and lv_layer hold what udev's DM_NAME, DM_UUID, DM_VG_NAME,
    DM_LV_NAME and DM_LV_LAYER hold (lvm2 11-dm-lvm.rules), as in node_disk_device_mapper_info:
    the two join on `device` alone. The layer names LVM's hidden devices only."""
    tree, _ = full_tree(str(tmp_path))
    s = Scraped(registry_for(tree, "--no-collector.dm"))
    for device, name, lv, layer in (
        ("dm-0", "vg-lv-real", "lv", "real"),
        ("dm-1", "vg-snap-cow", "snap", "cow"),
        ("dm-2", "vg-lv", "lv", ""),
        ("dm-3", "vg-snap", "snap", ""),
    ):
        assert (
            s.get(
                "blockstack_device_info",
                device=device,
                kind="dm",
                name=name,
                uuid=f"LVM-{device}fixture",
                vg_name="vg",
                lv_name=lv,
                lv_layer=layer,
                backing_file="",
            )
            == 1
        )


def test_device_numbers_encoded_as_st_rdev():
    # loop0 is 7:0 in the fixture; devno is what stat(2) gives as st_rdev (os.makedev)
    assert (
        value(
            "blockstack_device_number_info",
            device="loop0",
            major_minor="7:0",
            devno=str(os.makedev(7, 0)),
        )
        == 1
    )
    assert stack.encode_dev(259, 300) == os.makedev(259, 300)
    assert stack.encode_dev(7, 1048575) == os.makedev(7, 1048575)
