"""The VM lab's Debian host (blockstack_lab/debian_host.py): a Debian 12 image built by mmdebstrap,
booted by QEMU with Debian's 6.1 kernel and initrd, is a real host: systemd is PID 1 and the boot
finishes, udev names the emulated NVMe device and LVM's links (the image's own lvm.conf, udev_sync
on), apt installs from the lab's local repo without network (a package by name, a .deb copied in
with its dependencies), Debian's node_exporter answers through its forwarded port, and all of it
comes back after a reboot and after a power cycle."""

import os
import subprocess

import pytest

from blockstack_lab import debian_host, vm
from blockstack_testsupport import procs

pytestmark = [pytest.mark.vm, pytest.mark.root]

KERNEL = "6.1"


@pytest.fixture
def debian_prerequisites():
    problems = debian_host.missing(KERNEL)
    if problems:
        pytest.fail("the Debian host needs: " + "; ".join(problems))


def _dummy_deb(tmp_path):
    """A .deb of our own that needs python3-yaml (in the local repo, not in the image)."""
    root = tmp_path / "blockstack-lab-dummy"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: blockstack-lab-dummy\nVersion: 1.0\nArchitecture: all\nMaintainer: lab <lab@localhost>\n"
        "Depends: python3-yaml\nDescription: the VM lab's test package\n"
    )
    (root / "usr/share/blockstack-lab-dummy").mkdir(parents=True)
    (root / "usr/share/blockstack-lab-dummy/hello").write_text("hello\n")
    deb = tmp_path / "blockstack-lab-dummy_1.0_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def _wait_active(host, unit, timeout=120):
    return procs.wait_until(
        f"{unit} active in the guest", lambda: host.unit_active(unit) == "active", timeout, 2
    )


def _metrics(host):
    return procs.wait_until(
        "node_exporter on its forwarded port",
        lambda: procs.http_get(f"http://127.0.0.1:{host.ports['node']}/metrics", timeout=20),
        120,
        2,
    )


def test_debian_host(debian_prerequisites, tmp_path):
    times = vm.Phases()
    image = debian_host.build_image(KERNEL, say=vm.say)
    times.end("image (cached or built)")
    repo = debian_host.build_repo(kernel=KERNEL, image=image, say=vm.say)
    times.end("repo (cached or built)")
    deb = _dummy_deb(tmp_path)
    with debian_host.DebianHost(KERNEL, nvme=1, repo=repo, say=vm.say) as host:
        directory = host.dir
        times.end("boot (agent answers, then apt-get update)")
        assert host.run(["cat", "/proc/1/comm"]).stdout.strip() == "systemd"
        state = host.system_state()
        times.end("boot finished (is-system-running --wait)")
        print(
            f"\nsystemctl is-system-running: {state}; failed units: {host.failed_units() or 'none'}"
        )
        assert state in ("running", "degraded"), host.failed_units()
        assert host.unit_active("systemd-udevd") == "active"

        # udev: the NVMe device, then LVM's links with the image's own lvm.conf (udev_sync = 1)
        host.run("udevadm settle")
        assert host.run("test -b /dev/nvme0n1", check=False).rc == 0, host.run(
            "ls /dev", check=False
        ).stdout
        assert (
            host.run(["lvmconfig", "--type", "full", "activation/udev_sync"]).stdout.strip()
            == "udev_sync=1"
        )
        host.run(
            "pvcreate -q /dev/nvme0n1 && vgcreate -q vg /dev/nvme0n1 && lvcreate -q -y -L 64M -n lv vg"
        )
        host.run("udevadm settle")
        links = host.run("readlink -f /dev/mapper/vg-lv /dev/vg/lv").stdout.split()
        assert len(links) == 2 and links[0] == links[1] and links[0].startswith("/dev/dm-"), links
        times.end("NVMe and LVM")

        # apt: a package by name from the local repo, a .deb copied in with its dependencies
        host.apt_install("prometheus-node-exporter")
        times.end("apt-get install prometheus-node-exporter")
        _wait_active(host, "prometheus-node-exporter")
        assert "node_exporter_build_info" in _metrics(host)
        times.end("node_exporter active and scraped")
        guest_deb = host.copy_in(str(deb), "/root/")
        assert guest_deb == "/root/" + deb.name
        host.apt_install(guest_deb)
        assert (
            host.run(["python3", "-c", "import yaml; print(yaml.__name__)"]).stdout.strip()
            == "yaml"
        )
        assert host.run(["cat", "/usr/share/blockstack-lab-dummy/hello"]).stdout == "hello\n"
        times.end("copy_in and apt-get install ./x.deb")

        # a reboot brings node_exporter back (enabled), and LVM activates vg/lv by itself
        host.reboot()
        times.end("reboot (agent answers)")
        _wait_active(host, "prometheus-node-exporter")
        assert "node_exporter_build_info" in _metrics(host)
        state = host.system_state()
        print(f"after the reboot: {state}; failed units: {host.failed_units() or 'none'}")
        assert state in ("running", "degraded"), host.failed_units()
        assert host.run("udevadm settle && test -L /dev/vg/lv", check=False).rc == 0, host.run(
            "lvs; ls -l /dev/mapper", check=False
        ).stdout
        times.end("after the reboot: node_exporter back")
        # the same after a power cycle (a new QEMU on the same disks)
        host.power_cycle()
        times.end("power cycle (agent answers)")
        _wait_active(host, "prometheus-node-exporter")
        assert "node_exporter_build_info" in _metrics(host)
        assert host.run("udevadm settle && test -L /dev/vg/lv", check=False).rc == 0
        times.end("after the power cycle: node_exporter back")
    times.end("power-off")
    assert not os.path.exists(directory)
    print(
        f"{host.release}: first boot {host.boot_seconds:.1f} s (apt-get update {host.apt_update_seconds:.1f} s), "
        f"reboot {host.reboot_seconds[0]:.1f} s, power cycle {host.power_cycle_seconds[0]:.1f} s; "
        f"phases (s): {dict(times)}; image {os.path.basename(image.path)}"
    )
