"""How each fix is made to persist, and what would undo it: the doctor's `persist` recipes.

checks.py says what a persistent fix is, abstractly (Finding.spec: "queue attribute nomerges of
nvme1n1 = 0", "dioread_lock in fstab for /srv"), and reads no file; this module turns a spec
into recipes for a Debian 12 host with systemd and udev, reading what it needs (a device's
stable identity in sysfs and udev's database) under the doctor's roots. Each recipe is data
(`blockstack-doctor --json`: findings[].recipes) a test can apply:

    {"how": "udev" | "fstab" | "journal" | "lvm.conf" | "snapshot" | "crypttab" | "luks2",
     "summary": one line for a person,
     "file": the file written or edited (absent when none), "content": its whole text when the
             recipe writes it whole (a udev rule),
     "command": one pasteable shell command that applies the recipe and makes it take effect now,
     "then": the commands `command` ends with (what makes it take effect), for a test to run apart,
     "verify": a shell command that exits 0 once the setting is in place,
     "automatic": true when `command` needs nobody (no placeholder, no passphrase, no unmount of /),
     "clears": true when the finding is gone once the recipe is applied and the host rebooted,
             false when the recipe prevents the next one (an invalid snapshot stays invalid),
     "needs": what must hold first (None when nothing), "stable": for udev, whether the rule's
             match survives a reboot (false only for the KERNEL== fallback)}

The inverse case, what writes a queue attribute again after an operator fixed it by hand, is
setters.py's.
"""

import os
import re
import shlex

from .setters import Scan
from .settings import BY_FILE

UDEV_DATA = "/run/udev/data"  # udev's database: E:KEY=value lines per device, b<major>:<minor>
# Our rules' number: after 10-dm.rules and 11-dm-lvm.rules (DM_UUID, DM_NAME),
# 60-persistent-storage.rules (ID_SERIAL, ID_WWN, ID_PATH) and 63-md-raid-arrays.rules
# (MD_UUID), whose properties they match on; a 99-*.rules that writes the same attribute still
# runs after them and wins (setters.py names it).
RULE_PREFIX = "90-blockstack"
LVM_CONF = "/etc/lvm/lvm.conf"
FSTAB = "/etc/fstab"
CRYPTTAB = "/etc/crypttab"


class Context:
    """The roots the recipes and the scan read under: sysfs for a device's identity, rootfs for
    /etc, /run and /usr (the doctor's --path.rootfs; fixture trees in tests)."""

    def __init__(self, sysfs="/sys", rootfs="/"):
        self.sysfs, self.rootfs = sysfs, rootfs

    def path(self, host_path):
        return os.path.join(self.rootfs, host_path.lstrip("/"))

    def read(self, path):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def sys_attr(self, device, attr):
        text = self.read(os.path.join(self.sysfs, "class", "block", device, attr))
        return text.strip() if text else None

    def udev_env(self, device):
        """{KEY: value} of udev's database for the device ({} without one)."""
        devno = self.sys_attr(device, "dev")
        text = self.read(self.path(f"{UDEV_DATA}/b{devno}")) if devno else None
        env = {}
        for line in (text or "").splitlines():
            if line.startswith("E:") and "=" in line:
                key, _, value = line[2:].partition("=")
                env[key] = value
        return env


# --- a device's stable identity ----------------------------------------------------------------


def _glob_safe(value):
    """A udev match value standing for exactly `value`: characters udev reads as a pattern or
    cannot hold in a string become '?', which matches them."""
    return re.sub(r'[*?\[\]|"\\]', "?", value.strip())


def identity(ctx, device, info):
    """(match keys, what they are, stable) for a udev rule that must find this device again
    after a reboot, when its kernel name may differ: DM_UUID (or DM_NAME) for dm, the NVMe
    namespace's WWID, udev's ID_SERIAL or ID_PATH, a virtio serial, the SCSI WWID, md's
    MD_UUID, a loop device's backing file; KERNEL== only when none is there (not stable)."""
    for key, value, what in _identities(ctx, device, info):
        if value:
            return [f'{key}=="{_glob_safe(value)}"'], what, True
    return (
        [f'KERNEL=="{device}"'],
        f"the kernel name {device}: NOT stable across reboots (no serial, WWID or "
        "path found); replace it with a match from `udevadm info --query=property --name="
        + device
        + "`",
        False,
    )


def _identities(ctx, device, info):
    """(udev match key, its value for the device or None, what it is), the most telling first;
    each read only when those before it are absent."""
    kind = info.get("kind")
    if kind == "dm":
        uuid = info.get("uuid") or ctx.sys_attr(device, "dm/uuid")
        yield "ENV{DM_UUID}", uuid, "the dm uuid (10-dm.rules' DM_UUID)"
        name = info.get("name") or ctx.sys_attr(device, "dm/name")
        yield "ENV{DM_NAME}", name, "the dm name (10-dm.rules' DM_NAME)"
    if kind == "loop":
        backing = info.get("backing_file") or ctx.sys_attr(device, "loop/backing_file")
        yield (
            "ATTR{loop/backing_file}",
            backing,
            "its backing file (loop/backing_file, read when it is attached)",
        )
    env = ctx.udev_env(device)
    if kind == "md":
        yield "ENV{MD_UUID}", env.get("MD_UUID"), "the array's uuid (MD_UUID)"
        yield "ATTR{md/uuid}", ctx.sys_attr(device, "md/uuid"), "the array's uuid (md/uuid)"
    wwid = ctx.sys_attr(device, "wwid")
    if device.startswith("nvme"):
        yield "ATTR{wwid}", wwid, "the NVMe namespace's WWID (ATTR{wwid})"
    for key in ("ID_SERIAL", "ID_WWN"):
        yield f"ENV{{{key}}}", env.get(key), f"udev's {key} (60-persistent-storage.rules)"
    yield "ATTR{serial}", ctx.sys_attr(device, "serial"), "the disk's serial (ATTR{serial}, virtio)"
    scsi = ctx.sys_attr(device, "device/wwid")
    yield "ATTRS{wwid}", scsi, "the SCSI device's WWID (ATTRS{wwid})"
    yield "ATTR{wwid}", wwid, "the device's WWID (ATTR{wwid})"
    yield (
        "ENV{ID_PATH}",
        env.get("ID_PATH"),
        "udev's ID_PATH (the bus position: stable while the hardware stays where it is)",
    )


# --- recipes -----------------------------------------------------------------------------------


def _slug(text):
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "device"


def _dev_path(host, device):
    info = host.devices.get(device, {})
    if info.get("kind") == "dm" and info.get("name"):
        return f"/dev/mapper/{info['name']}"
    return f"/dev/{device}"


def udev_recipe(ctx, host, spec):
    device, attr, value = spec["device"], spec["attr"], spec["value"]
    info = host.devices.get(device, {})
    match, what, stable = identity(ctx, device, info)
    name = info.get("name") if info.get("kind") == "dm" and info.get("name") else device
    path = f"/etc/udev/rules.d/{RULE_PREFIX}-{_slug(name)}-{attr}.rules"
    rule = ", ".join(
        [
            'ACTION=="add|change"',
            'SUBSYSTEM=="block"',
            'ENV{DEVTYPE}=="disk"',
            *match,
            f'ATTR{{queue/{attr}}}="{value}"',
        ]
    )
    key = match[0].split("==")[0]
    content = f"# blockstack-doctor: {attr}={value} on {device} (kernel name today), matched by its {key}\n{rule}\n"
    then = [
        "udevadm control --reload",
        f"udevadm trigger --action=change --subsystem-match=block --sysname-match={device}",
        "udevadm settle",
    ]
    write = f"printf '%s\\n' {shlex.quote(content.splitlines()[0])} {shlex.quote(rule)} > {path}"
    return {
        "how": "udev",
        "summary": f"{path}, matched by {what}",
        "file": path,
        "content": content,
        "command": " && ".join([write, *then]),
        "then": then,
        "verify": (
            f"grep -q '\\[{value}\\]' /sys/block/{device}/queue/scheduler"
            if BY_FILE[attr].choice
            else f'test "$(cat /sys/block/{device}/queue/{attr})" = {shlex.quote(value)}'
        ),
        "automatic": True,
        "clears": True,
        "needs": None,
        "stable": stable,
    }


def fstab_recipe(ctx, host, spec):
    mnt, add, drop = spec["mountpoint"], spec["add"], spec.get("drop", "")
    awk = (
        'BEGIN {OFS = "\\t"} $1 !~ /^#/ && $2 == ENVIRON["MNT"] {n = split($4, o, ","); s = ""; '
        'for (i = 1; i <= n; i++) if (o[i] != add && o[i] != drop && o[i] != "") s = s (s == "" ? "" : ",") o[i]; '
        '$4 = (s == "" ? "" : s ",") add; if ($5 == "") $5 = 0; if ($6 == "") $6 = 0; found = 1} {print} '
        'END {if (!found) {print "no line of /etc/fstab mounts " ENVIRON["MNT"] > "/dev/stderr"; exit 1}}'
    )
    bak, new = f"{FSTAB}.blockstack.bak", f"{FSTAB}.blockstack.new"
    edit = (
        f"cp -p {FSTAB} {bak} && MNT={shlex.quote(_fstab_escape(mnt))} awk -v add={add} -v drop={drop or '-'} "
        f"{shlex.quote(awk)} {bak} > {new} && cat {new} > {FSTAB} && rm {new}"
    )
    then = ["systemctl daemon-reload", f"mount -o remount,{add} {shlex.quote(mnt)}"]
    return {
        "how": "fstab",
        "summary": f"{add} in {FSTAB}'s options for {mnt} (systemd-remount-fs applies them to / "
        "at boot)",
        "file": FSTAB,
        "content": None,
        "command": " && ".join([edit, *then]),
        "then": then,
        # the kernel shows dioread_lock as nodioread_nolock, which grep -w does not take for dioread_nolock
        "verify": f"findmnt --fstab -n -o OPTIONS --mountpoint {shlex.quote(mnt)} | grep -qw {add} && "
        f"! grep -qw {drop} /proc/fs/ext4/{spec['device']}/options",
        "automatic": bool(spec["mountpoint"]),
        "clears": True,
        "needs": None
        if spec["mountpoint"]
        else "the filesystem's mountpoint (not found in mountinfo)",
        "stable": True,
    }


def _fstab_escape(mnt):
    """fstab(5) writes a space in a path as \\040 (and a tab as \\011)."""
    return mnt.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")


def journal_recipe(ctx, host, spec):
    device, mnt, size = spec["device"], spec["mountpoint"], spec["size_mib"]
    dev = _dev_path(host, device)
    in_fstab = mnt and any(
        line.split()[1:2] == [_fstab_escape(mnt)]
        for line in (ctx.read(ctx.path(FSTAB)) or "").splitlines()
        if not line.lstrip().startswith("#")
    )
    remount = (
        f"mount {shlex.quote(mnt)}"
        if in_fstab
        else f"mount {dev} {shlex.quote(mnt)}"
        if mnt
        else None
    )
    # a cleanly unmounted filesystem needs no e2fsck for this (tune2fs refuses ^has_journal when it
    # needs recovery, and says so)
    steps = [
        f"umount {shlex.quote(mnt)}" if mnt else None,
        f"tune2fs -O ^has_journal {dev}",
        f"tune2fs -J size={size} {dev}",
        remount,
    ]
    root = mnt == "/"
    return {
        "how": "journal",
        "summary": f"a {size} MiB journal, made unmounted (tune2fs cannot resize a journal: "
        "remove it, then add one of the size)",
        "file": None,
        "content": None,
        "command": " && ".join(s for s in steps if s),
        "then": [],
        "verify": f"dumpe2fs -h {dev} 2>/dev/null | grep -Eq '^(Total j|J)ournal size: +{size}M$'",
        "automatic": bool(mnt) and not root,
        "clears": True,
        "needs": (
            "the filesystem unmounted: nothing may hold it open; for / boot a rescue system"
            if root or not mnt
            else "the filesystem unmounted: nothing may hold it open"
        )
        + f"; a filesystem many times larger than {size} MiB (tune2fs refuses a journal too big for it)",
        "stable": True,
    }


def lvm_conf_recipe(ctx, host, spec):
    settings = spec["settings"]
    f = LVM_CONF
    parts = [
        f"cp -p {f} {f}.blockstack.bak",
        f"{{ grep -Eq '^[[:space:]]*activation[[:space:]]*\\{{' {f} || printf 'activation {{\\n}}\\n' >> {f}; }}",
    ]
    for key, value in reversed(settings.items()):
        # an uncommented setting gets the value; else it goes first in the activation section (in
        # reverse, so that the settings read in their order)
        parts.append(
            f"if grep -Eq '^[[:space:]]*{key}[[:space:]]*=' {f}; then "
            f"sed -i -E 's/^([[:space:]]*{key}[[:space:]]*=[[:space:]]*)[0-9]+/\\1{value}/' {f}; else "
            f"sed -i -E '0,/^[[:space:]]*activation[[:space:]]*\\{{/s//&\\n\\t{key} = {value}/' {f}; fi"
        )
    then = [f"lvchange --monitor y {lv}" for lv in spec.get("monitor", ())]
    text = " and ".join(f"{k} = {v}" for k, v in settings.items())
    return {
        "how": "lvm.conf",
        "summary": f"{f}: activation {{ {text} }}; dmeventd monitors the volume "
        "(lvchange --monitor y)",
        "file": f,
        "content": None,
        "command": " && ".join(parts + then),
        "then": then,
        "verify": " && ".join(
            f"lvmconfig --type full activation/{k} | grep -qx '{k}={v}'"
            for k, v in settings.items()
        ),
        "automatic": True,
        "clears": spec.get("clears", True),
        "needs": None,
        "stable": True,
    }


def snapshot_recipe(ctx, host, spec):
    lv, origin, chunk, cow = spec["lv"], spec["origin"], spec["chunk_kib"], spec.get("cow_bytes")
    vg, name = lv.split("/", 1) if "/" in lv else ("<VG>", lv)
    size = f"{-(-int(cow) // (1 << 20))}m" if cow else "<COW size>"
    command = f"lvremove -y {lv} && lvcreate -s -c {chunk}k -L {size} -n {name} {origin}"
    return {
        "how": "snapshot",
        "summary": f"recreate the snapshot with -c {chunk}k (a chunk size is in the COW's "
        "on-disk header, kept across reboots); give -c to every lvcreate -s that "
        "makes snapshots (backup scripts): LVM has no default for it",
        "file": None,
        "content": None,
        "command": command,
        "then": [],
        "verify": f"test \"$(lvs --noheadings -o chunk_size --units k --nosuffix {lv} | tr -d ' ' | cut -d. -f1)\" "
        f"= {chunk}",
        "automatic": bool(cow) and "/" in origin,
        "clears": True,
        "needs": "the snapshot's reader done: lvremove discards what it holds",
        "stable": True,
    }


def crypt_recipes(ctx, host, spec):
    name = spec["name"]
    flags = "--perf-no_read_workqueue --perf-no_write_workqueue"
    luks2 = {
        "how": "luks2",
        "summary": "the flags in the LUKS2 header (cryptsetup refresh --persistent)",
        "file": None,
        "content": None,
        "command": f"cryptsetup refresh --persistent {flags} {name}",
        "then": [],
        "verify": f"dmsetup table {name} | grep -q no_read_workqueue",
        "automatic": False,
        "clears": True,
        "needs": "LUKS2 and the passphrase (asked; --key-file FILE for a test)",
        "stable": True,
    }
    awk = (
        'BEGIN {OFS = "\\t"} $1 == name {if ($3 == "") $3 = "none"; n = split($4, o, ","); s = ""; '
        'for (i = 1; i <= n; i++) if (o[i] != "no-read-workqueue" && o[i] != "no-write-workqueue" && o[i] != "") '
        's = s (s == "" ? "" : ",") o[i]; $4 = (s == "" ? "" : s ",") "no-read-workqueue,no-write-workqueue"; '
        "found = 1} {print} "
        'END {if (!found) {print "no line of /etc/crypttab names " name > "/dev/stderr"; exit 1}}'
    )
    bak, new = f"{CRYPTTAB}.blockstack.bak", f"{CRYPTTAB}.blockstack.new"
    tab = {
        "how": "crypttab",
        "summary": f"no-read-workqueue,no-write-workqueue in {CRYPTTAB}'s options for {name} "
        "(systemd-cryptsetup reads them at boot; for a volume the initramfs "
        "unlocks, update-initramfs -u)",
        "file": CRYPTTAB,
        "content": None,
        "command": f"cp -p {CRYPTTAB} {bak} && awk -v name={shlex.quote(name)} {shlex.quote(awk)} {bak} > {new} && "
        f"cat {new} > {CRYPTTAB} && rm {new} && update-initramfs -u",
        "then": ["update-initramfs -u"],
        "verify": f"awk -v name={shlex.quote(name)} '$1 == name && $4 ~ /no-read-workqueue/ {{ok = 1}} "
        f"END {{exit !ok}}' {CRYPTTAB}",
        "automatic": True,
        "clears": True,
        "needs": None,
        "stable": True,
    }
    return [luks2, tab]


_BUILDERS = {
    "udev": udev_recipe,
    "fstab": fstab_recipe,
    "journal": journal_recipe,
    "lvm.conf": lvm_conf_recipe,
    "snapshot": snapshot_recipe,
}


def recipes(ctx, host, specs):
    out = []
    for spec in specs or ():
        if spec["how"] == "crypt":
            out += crypt_recipes(ctx, host, spec)
        else:
            out.append(_BUILDERS[spec["how"]](ctx, host, spec))
    return out


def attach(ctx, host, findings):
    """Give each finding its recipes, its persist line from them, and, for a queue attribute,
    the udev rules and tuned profile that would write it again (evidence)."""
    scan = Scan(ctx)
    for f in findings:
        f.recipes = recipes(ctx, host, f.spec)
        if f.recipes:
            f.persist = " | or: ".join(r["summary"] for r in f.recipes)
        for spec in f.spec or ():
            if spec["how"] == "udev":
                f.evidence += [s.evidence(spec["device"]) for s in scan.setters(host, spec)]
