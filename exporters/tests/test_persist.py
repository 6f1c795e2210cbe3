"""The doctor's persist recipes (persist.py) on fixture trees: each recipe's data, its commands
run by sh on copies of the files they edit (the paths repointed, nothing else), and the inverse
case: a udev rule or tuned's active profile that writes a queue attribute again, named with its
file and line. The recipes on a real Debian 12 guest (applied, rebooted, still fixed) are the
integrator's VM test: docs/persist.md."""

import os
import re
import subprocess

import doctor_trees
import pytest
from test_doctor import NO_LVM_CONF, doctor, findings

from blockstack_exporter import checks, persist, setters
from blockstack_exporter.sampling import parse_lvm_conf

KEYS = {
    "how",
    "summary",
    "file",
    "content",
    "command",
    "then",
    "verify",
    "automatic",
    "clears",
    "needs",
    "stable",
}


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("persist-trees"))
    return {name: doctor_trees.build(base, name) for name in doctor_trees.TREES}


@pytest.fixture
def incident(tmp_path):
    """A private nvme-incident tree (its rootfs may gain rules, tuned profiles, a udev database)."""
    return doctor_trees.build(str(tmp_path), "nvme-incident")


def _write(root, path, text):
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text)
    return full


def sh(command, **env):
    return subprocess.run(
        ["sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, **env),
    )


def test_every_finding_has_recipes_a_test_can_apply(trees):
    seen = set()
    for name, (tree, dm) in trees.items():
        _, report = findings(tree, dm)
        for f in report["findings"]:
            assert f["recipes"], (name, f["check"])
            for r in f["recipes"]:
                seen.add((f["check"], r["how"]))
                assert set(r) == KEYS, (f["check"], set(r) ^ KEYS)
                assert r["command"] and r["verify"] and r["summary"]
                assert r["command"].endswith(" && ".join(r["then"])) if r["then"] else True
                if r["automatic"]:
                    assert not re.search(r"<[A-Z][A-Za-z /]*>", r["command"]), r[
                        "command"
                    ]  # no placeholder
            assert f["persist"] == " | or: ".join(r["summary"] for r in f["recipes"])
    assert {c for c, _ in seen} >= {
        "nomerges_beneath_stack",
        "max_sectors_low",
        "ext4_journal_small",
        "snapshot_chunk_small",
        "lvm_autoextend_off",
        "snapshot_invalid",
        "crypt_workqueue",
    }


def test_udev_rule_matches_a_stable_identity(incident):
    root, dm = incident
    sysfs = os.path.join(root, "sys")
    ctx = persist.Context(sysfs, root)
    _write(sysfs, "class/block/nvme1n1/wwid", "eui.0025385b71b07e2f\n")
    _, report = findings(root, dm)
    f = next(f for f in report["findings"] if f["check"] == "nomerges_beneath_stack")
    (r,) = f["recipes"]
    assert r["file"] == "/etc/udev/rules.d/90-blockstack-nvme1n1-nomerges.rules"
    rule = r["content"].splitlines()[-1]
    assert rule == (
        'ACTION=="add|change", SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", '
        'ATTR{wwid}=="eui.0025385b71b07e2f", ATTR{queue/nomerges}="0"'
    )
    assert r["stable"] and r["clears"] and r["automatic"]
    assert r["then"] == [
        "udevadm control --reload",
        "udevadm trigger --action=change --subsystem-match=block --sysname-match=nvme1n1",
        "udevadm settle",
    ]
    # dm: DM_UUID; a disk: udev's ID_SERIAL, else its path; nothing: KERNEL==, said to be unstable
    host = checks.Host()
    host.devices = {
        "dm-1": {"kind": "dm", "name": "secvol-seclv-real", "uuid": "LVM-abc-real"},
        "sdb": {"kind": "disk", "name": "sdb"},
        "sdc": {"kind": "disk", "name": "sdc"},
        "loop3": {"kind": "loop", "name": "loop3", "backing_file": "/srv/a b.img"},
    }
    assert persist.identity(ctx, "dm-1", host.devices["dm-1"])[0] == [
        'ENV{DM_UUID}=="LVM-abc-real"'
    ]
    assert persist.identity(ctx, "loop3", host.devices["loop3"])[0] == [
        'ATTR{loop/backing_file}=="/srv/a b.img"'
    ]
    for disk, devno in (("sdb", "8:16"), ("sdc", "8:32")):
        _write(sysfs, f"class/block/{disk}/dev", devno + "\n")
    _write(
        root,
        "/run/udev/data/b8:16",
        "S:disk/by-id/x\nE:ID_SERIAL=Samsung_SSD_870_S5*X\nE:ID_PATH=pci-0:1\n",
    )
    _write(root, "/run/udev/data/b8:32", "E:ID_PATH=pci-0000:00:1f.2-ata-3\n")
    assert persist.identity(ctx, "sdb", host.devices["sdb"])[0] == [
        'ENV{ID_SERIAL}=="Samsung_SSD_870_S5?X"'
    ]
    assert persist.identity(ctx, "sdc", host.devices["sdc"])[0] == [
        'ENV{ID_PATH}=="pci-0000:00:1f.2-ata-3"'
    ]
    match, what, stable = persist.identity(ctx, "sdz", {"kind": "disk"})
    assert match == ['KERNEL=="sdz"'] and not stable and "NOT stable" in what


def test_udev_command_writes_exactly_the_rule(trees, tmp_path):
    tree, dm = trees["host-loop"]
    _, report = findings(tree, dm)
    for f in report["findings"]:
        for r in f["recipes"]:
            if r["how"] != "udev":
                continue
            target = tmp_path / os.path.basename(r["file"])
            write = (
                r["command"][: -len(" && ".join(r["then"]))]
                .rstrip("& ")
                .replace(r["file"], str(target))
            )
            assert sh(write).returncode == 0
            assert target.read_text() == r["content"]


FSTAB = """# /etc/fstab: static file system information.
UUID=1111-2222 /               ext4    errors=remount-ro 0       1
/dev/loop0     /mnt/blockstack-lower ext4 defaults,dioread_nolock 0 2
/dev/sdb1      /mnt/blockstack-lowerx ext4 defaults 0 2
"""


def _fstab_recipe(trees):
    tree, dm = trees["host-loop"]
    _, report = findings(tree, dm)
    f = next(f for f in report["findings"] if f["check"] == "ext4_journal_small")
    return f, next(r for r in f["recipes"] if r["how"] == "fstab")


def test_fstab_recipe_edits_one_line_and_is_idempotent(trees, tmp_path):
    f, r = _fstab_recipe(trees)
    fstab = tmp_path / "fstab"
    fstab.write_text(FSTAB)
    edit = (
        r["command"][: -len(" && ".join(r["then"]))].rstrip("& ").replace("/etc/fstab", str(fstab))
    )
    for _ in range(2):
        assert sh(edit).returncode == 0
        lines = fstab.read_text().splitlines()
        assert lines[2].split() == [
            "/dev/loop0",
            "/mnt/blockstack-lower",
            "ext4",
            "defaults,dioread_lock",
            "0",
            "2",
        ]
        assert (
            lines[:2] + lines[3:] == FSTAB.splitlines()[:2] + FSTAB.splitlines()[3:]
        )  # nothing else moved
    assert r["then"] == [
        "systemctl daemon-reload",
        "mount -o remount,dioread_lock /mnt/blockstack-lower",
    ]
    fstab.write_text(FSTAB.replace("/mnt/blockstack-lower ", "/elsewhere "))
    out = sh(edit)
    assert out.returncode != 0 and "mounts /mnt/blockstack-lower" in out.stderr
    assert fstab.read_text() == FSTAB.replace(
        "/mnt/blockstack-lower ", "/elsewhere "
    )  # left as it was
    journal = next(r for r in f["recipes"] if r["how"] == "journal")
    assert (
        "tune2fs -O ^has_journal /dev/loop0 && tune2fs -J size=1024 /dev/loop0"
        in journal["command"]
    )
    assert journal["command"] == (
        "umount /mnt/blockstack-lower && tune2fs -O ^has_journal /dev/loop0 && "
        "tune2fs -J size=1024 /dev/loop0 && mount /dev/loop0 /mnt/blockstack-lower"
    )
    assert "unmounted" in journal["needs"]


DEBIAN_LVM_CONF = """config {
\tcheckpoint = 0
}
activation {
\t# Configuration option activation/snapshot_autoextend_threshold.
\t# snapshot_autoextend_threshold = 100
\t# snapshot_autoextend_percent = 20
\tmonitoring = 1
}
"""


@pytest.mark.parametrize(
    "conf",
    [
        DEBIAN_LVM_CONF,
        DEBIAN_LVM_CONF.replace(
            "\t# snapshot_autoextend_threshold = 100", "\tsnapshot_autoextend_threshold = 100"
        ),
        "devices {\n}\n",  # no activation section at all
    ],
)
def test_lvm_conf_recipe_then_the_finding_is_gone(trees, tmp_path, conf):
    tree, dm = trees["nvme-incident"]
    _, report = findings(tree, dm)
    f = next(f for f in report["findings"] if f["check"] == "lvm_autoextend_off")
    (r,) = f["recipes"]
    assert r["then"] == ["lvchange --monitor y secvol/tmp_backup1"] and r["clears"]
    path = tmp_path / "lvm.conf"
    path.write_text(conf)
    apply = r["command"][: -len(r["then"][0])].rstrip("& ").replace(persist.LVM_CONF, str(path))
    for _ in range(2):
        out = sh(apply)
        assert out.returncode == 0, out.stderr
        assert parse_lvm_conf(path.read_text()) == {"snapshot_autoextend_threshold": 70}
        assert (
            len(re.findall(r"^\s*snapshot_autoextend_percent = 20$", path.read_text(), re.M)) == 1
        )
    _, after = findings(tree, dm, f"--path.lvmconf={path}")
    assert "lvm_autoextend_off" not in {f["check"] for f in after["findings"]}


def test_crypttab_recipe(trees, tmp_path):
    tree, dm = trees["unknown-targets"]
    _, report = findings(tree, dm)
    f = next(f for f in report["findings"] if f["check"] == "crypt_workqueue")
    luks2, tab = f["recipes"]
    assert (
        luks2["command"]
        == (
            "cryptsetup refresh --persistent --perf-no_read_workqueue "
            "--perf-no_write_workqueue debian_crypt"
        )
        and not luks2["automatic"]
    )
    crypttab = tmp_path / "crypttab"
    crypttab.write_text(
        "# <target name> <source device> <key file> <options>\n"
        "debian_crypt UUID=abcd none luks,discard\nother UUID=ef\n"
    )
    edit = tab["command"][: -len(" && update-initramfs -u")].replace("/etc/crypttab", str(crypttab))
    assert sh(edit).returncode == 0 and sh(edit).returncode == 0
    lines = crypttab.read_text().splitlines()
    assert lines[1].split() == [
        "debian_crypt",
        "UUID=abcd",
        "none",
        "luks,discard,no-read-workqueue,no-write-workqueue",
    ]
    assert lines[2] == "other UUID=ef"
    assert sh(tab["verify"].replace("/etc/crypttab", str(crypttab))).returncode == 0


def test_snapshot_recipe_names_origin_and_cow_size(trees):
    tree, dm = trees["nvme-incident"]
    _, report = findings(tree, dm)
    f = next(f for f in report["findings"] if f["check"] == "snapshot_chunk_small")
    (r,) = f["recipes"]
    assert r["command"].startswith("lvremove -y secvol/tmp_backup1 && lvcreate -s -c 256k -L ")
    assert r["command"].endswith(" -n tmp_backup1 secvol/seclv") and r["automatic"]
    assert "lvremove discards" in r["needs"]


# --- the inverse case --------------------------------------------------------------------------

RULES_99 = """# made by a vendor's tuning script
ACTION=="add|change", SUBSYSTEM=="block", \\
  KERNEL=="nvme[0-9]*n[0-9]*", ATTR{queue/nomerges}="2"
ACTION=="add|change", KERNEL=="sd*", ATTR{queue/nomerges}="1"
ACTION=="remove", KERNEL=="nvme*", ATTR{queue/nomerges}="1"
ACTION=="add|change", ATTR{queue/rotational}=="0", ATTR{queue/max_sectors_kb}="4"
ACTION=="add", ENV{ID_SERIAL}=="Samsung*", RUN+="/bin/sh -c 'echo 1 > /sys/block/%k/queue/nomerges'"
ACTION=="add|change", KERNEL=="nvme1n1", ATTR{queue/nomerges}="0"
"""


def test_a_udev_rule_that_sets_it_again_is_named(incident):
    root, dm = incident
    _write(root, "/etc/udev/rules.d/99-x.rules", RULES_99)
    # masked: /etc's file of the same name wins over /usr/lib's (udev(7))
    _write(root, "/usr/lib/udev/rules.d/99-x.rules", 'KERNEL=="nvme*", ATTR{queue/nomerges}="1"\n')
    _write(
        root, "/usr/lib/udev/rules.d/60-other.rules", 'KERNEL=="dm-*", ATTR{queue/nomerges}="2"\n'
    )
    _, report = findings(root, dm)
    f = next(f for f in report["findings"] if f["check"] == "nomerges_beneath_stack")
    set_by = [e for e in f["evidence"] if e.startswith("set by ")]
    assert set_by == [
        'set by /etc/udev/rules.d/99-x.rules:2 (ATTR{queue/nomerges}="2"): overridden on each event by '
        '/etc/udev/rules.d/99-x.rules:8 (ATTR{queue/nomerges}="0"), which runs after it',
        'set by /etc/udev/rules.d/99-x.rules:7 (RUN+="...echo 1 > /sys/block/%k/queue/nomerges..."): it will set '
        'it again on the next add/change event; whether its ENV{ID_SERIAL}=="Samsung*" holds for nvme1n1 was not '
        "judged",
    ], set_by
    status, text = doctor(root, dm)
    assert "set by /etc/udev/rules.d/99-x.rules:2" in text
    # without line 8's fix, line 2 sets it again; RUN programs run after every rule
    _write(root, "/etc/udev/rules.d/99-x.rules", "\n".join(RULES_99.splitlines()[:7]) + "\n")
    _write(
        root,
        "/etc/udev/rules.d/98-fix.rules",
        'KERNEL=="nvme1n1", RUN+="/bin/sh -c \'echo 0 > /sys/block/%k/queue/nomerges\'"\n',
    )
    _, report = findings(root, dm)
    f = next(f for f in report["findings"] if f["check"] == "nomerges_beneath_stack")
    set_by = [e for e in f["evidence"] if e.startswith("set by ")]
    assert set_by[0].endswith(
        '(ATTR{queue/nomerges}="2"): overridden on each event by '
        '/etc/udev/rules.d/98-fix.rules:1 (RUN+="...echo 0 > /sys/block/%k/queue/nomerges..."), '
        "which runs after it"
    ), set_by
    assert (
        "it will set it again on the next add/change event; whether its ENV{ID_SERIAL}" in set_by[1]
    )


def test_a_rule_reading_an_attribute_is_judged_on_sysfs(incident):
    root, dm = incident
    _write(root, "/etc/udev/rules.d/99-x.rules", RULES_99)
    ctx = persist.Context(os.path.join(root, "sys"), root)
    host = checks.Host()
    host.devices = {"nvme1n1": {"kind": "disk"}}
    scan = setters.Scan(ctx)
    spec = {"how": "udev", "device": "nvme1n1", "attr": "max_sectors_kb", "value": "256"}
    assert [(s.line, s.value) for s in scan.setters(host, spec)] == [
        (6, "4")
    ]  # rotational 0 in the tree
    _write(root, "/sys/class/block/nvme1n1/queue/rotational", "1\n")
    assert setters.Scan(ctx).setters(host, spec) == []


def test_tuneds_active_profile_is_named(incident):
    root, dm = incident
    _write(root, "/etc/tuned/active_profile", "blockstack-bad\n")
    _write(
        root,
        "/etc/tuned/blockstack-bad/tuned.conf",
        "[main]\ninclude=throughput-performance\n\n[sysfs]\n/sys/block/nvme*/queue/nomerges=2\n",
    )
    _write(
        root,
        "/usr/lib/tuned/throughput-performance/tuned.conf",
        "[main]\nsummary=x\n\n[disk]\ndevices=!sd*\nelevator=bfq\nreadahead=>4096\n",
    )
    _write(
        root, "/usr/lib/tuned/unused/tuned.conf", "[sysfs]\n/sys/block/*/queue/nomerges=1\n"
    )  # not active
    _, report = findings(root, dm)
    f = next(f for f in report["findings"] if f["check"] == "nomerges_beneath_stack")
    set_by = [e for e in f["evidence"] if e.startswith("set by ")]
    assert set_by == [
        "set by /etc/tuned/blockstack-bad/tuned.conf:5 ([sysfs] /sys/block/nvme*/queue/nomerges=2): "
        "tuned's active profile blockstack-bad sets it again whenever tuned starts or applies the "
        "profile (tuned-adm off, or a profile without it)"
    ]
    ctx = persist.Context(os.path.join(root, "sys"), root)
    host = checks.Host()
    host.devices = {"nvme1n1": {"kind": "disk"}}
    spec = {"how": "udev", "device": "nvme1n1", "attr": "scheduler", "value": "none"}
    assert [(s.path, s.line, s.value) for s in setters.Scan(ctx).setters(host, spec)] == [
        ("/usr/lib/tuned/throughput-performance/tuned.conf", 6, "bfq")
    ]
    host.devices = {"sda": {"kind": "disk"}}
    assert setters.Scan(ctx).setters(host, dict(spec, device="sda")) == []  # devices=!sd*


def test_sysfsutils_is_named(incident):
    root, dm = incident
    _write(
        root,
        "/etc/sysfs.conf",
        "# sysfsutils\nmode block/nvme1n1/queue/nomerges = 0644\n"
        "block/nvme1n1/queue/nomerges = 2\nblock/sda/queue/nomerges = 2\n",
    )
    _write(root, "/etc/sysfs.d/local.conf", "block/nvme1n1/queue/nomerges = 0\n")
    _, report = findings(root, dm)
    f = next(f for f in report["findings"] if f["check"] == "nomerges_beneath_stack")
    assert [e for e in f["evidence"] if e.startswith("set by ")] == [
        "set by /etc/sysfs.conf:3 (block/nvme1n1/queue/nomerges = 2): sysfsutils writes it again at every boot "
        "(the sysfsutils service)"
    ]


def test_no_rules_no_setters_and_no_host_files_read(trees):
    """The fixture trees have no /etc: nothing is named, and the doctor read its rootfs, not this
    machine's /etc (the golden output does not depend on the machine)."""
    for name, (tree, dm) in trees.items():
        _, report = findings(tree, dm)
        assert not [
            e for f in report["findings"] for e in f["evidence"] if e.startswith("set by ")
        ], name


def test_logical_lines_join_continuations():
    assert setters._logical_lines('# c\n\nA=="1", \\\n  B="2"\nC="3"\n') == [
        (3, 'A=="1",  B="2"'),
        (5, 'C="3"'),
    ]


def test_lvm_conf_path_is_the_hosts_not_the_flag(trees):
    """--path.lvmconf is what the doctor reads; the recipe edits the host's /etc/lvm/lvm.conf."""
    tree, dm = trees["nvme-incident"]
    _, report = findings(tree, dm)
    r = next(f for f in report["findings"] if f["check"] == "lvm_autoextend_off")["recipes"][0]
    assert r["file"] == "/etc/lvm/lvm.conf" and NO_LVM_CONF not in r["command"]
