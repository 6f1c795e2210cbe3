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

The inverse case, `setters()`: a udev rule or the active tuned profile that writes a queue
attribute again after an operator fixed it by hand, named with its file and line.
"""

import fnmatch
import os
import re
import shlex

# udev reads rules from these directories; a file name in an earlier one masks the same name in
# a later one (udev(7), "Rules Files"); all files are then processed in lexical order of name.
# /lib/udev/rules.d is where Debian 12's split-/usr udev installs its rules (/usr/lib's twin on a
# merged-/usr host, read once).
UDEV_RULES_DIRS = (
    "/etc/udev/rules.d",
    "/run/udev/rules.d",
    "/usr/local/lib/udev/rules.d",
    "/usr/lib/udev/rules.d",
    "/lib/udev/rules.d",
)
# tuned(8): a profile in /etc masks the one of the same name in /usr/lib; tuned 2.20 moved them
# to .../tuned/profiles (Debian 12 ships 2.19: /etc/tuned/NAME, /usr/lib/tuned/NAME).
TUNED_DIRS = ("/etc/tuned/profiles", "/etc/tuned", "/usr/lib/tuned/profiles", "/usr/lib/tuned")
TUNED_ACTIVE = "/etc/tuned/active_profile"
# Debian's sysfsutils: /etc/init.d/sysfsutils writes "block/sda/queue/nomerges = 2" lines at boot
SYSFS_CONF = ("/etc/sysfs.conf", "/etc/sysfs.d")
UDEV_DATA = "/run/udev/data"  # udev's database: E:KEY=value lines per device, b<major>:<minor>
# Our rules' number: after 10-dm.rules and 11-dm-lvm.rules (DM_UUID, DM_NAME),
# 60-persistent-storage.rules (ID_SERIAL, ID_WWN, ID_PATH) and 63-md-raid-arrays.rules
# (MD_UUID), whose properties they match on; a 99-*.rules that writes the same attribute still
# runs after them and wins (setters() names it).
RULE_PREFIX = "90-blockstack"
LVM_CONF = "/etc/lvm/lvm.conf"
FSTAB = "/etc/fstab"
CRYPTTAB = "/etc/crypttab"
# tuned's [disk] plugin options that write a queue attribute (tuned/plugins/plugin_disk.py)
TUNED_DISK_OPTIONS = {"scheduler": "elevator", "read_ahead_kb": "readahead"}


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
    kind = info.get("kind")
    if kind == "dm":
        uuid = info.get("uuid") or ctx.sys_attr(device, "dm/uuid")
        if uuid:
            return (
                [f'ENV{{DM_UUID}}=="{_glob_safe(uuid)}"'],
                "the dm uuid (10-dm.rules' DM_UUID)",
                True,
            )
        name = info.get("name") or ctx.sys_attr(device, "dm/name")
        if name:
            return (
                [f'ENV{{DM_NAME}}=="{_glob_safe(name)}"'],
                "the dm name (10-dm.rules' DM_NAME)",
                True,
            )
    if kind == "loop":
        backing = info.get("backing_file") or ctx.sys_attr(device, "loop/backing_file")
        if backing:
            return (
                [f'ATTR{{loop/backing_file}}=="{_glob_safe(backing)}"'],
                "its backing file (loop/backing_file, read when it is attached)",
                True,
            )
    env = ctx.udev_env(device)
    if kind == "md":
        if env.get("MD_UUID"):
            return (
                [f'ENV{{MD_UUID}}=="{_glob_safe(env["MD_UUID"])}"'],
                "the array's uuid (MD_UUID)",
                True,
            )
        uuid = ctx.sys_attr(device, "md/uuid")
        if uuid:
            return [f'ATTR{{md/uuid}}=="{_glob_safe(uuid)}"'], "the array's uuid (md/uuid)", True
    wwid = ctx.sys_attr(device, "wwid")
    if device.startswith("nvme") and wwid:
        return (
            [f'ATTR{{wwid}}=="{_glob_safe(wwid)}"'],
            "the NVMe namespace's WWID (ATTR{wwid})",
            True,
        )
    for key, what in (
        ("ID_SERIAL", "udev's ID_SERIAL (60-persistent-storage.rules)"),
        ("ID_WWN", "udev's ID_WWN (60-persistent-storage.rules)"),
    ):
        if env.get(key):
            return [f'ENV{{{key}}}=="{_glob_safe(env[key])}"'], what, True
    serial = ctx.sys_attr(device, "serial")
    if serial:
        return (
            [f'ATTR{{serial}}=="{_glob_safe(serial)}"'],
            "the disk's serial (ATTR{serial}, virtio)",
            True,
        )
    scsi = ctx.sys_attr(device, "device/wwid")
    if scsi:
        return (
            [f'ATTRS{{wwid}}=="{_glob_safe(scsi)}"'],
            "the SCSI device's WWID (ATTRS{wwid})",
            True,
        )
    if wwid:
        return [f'ATTR{{wwid}}=="{_glob_safe(wwid)}"'], "the device's WWID (ATTR{wwid})", True
    if env.get("ID_PATH"):
        return (
            [f'ENV{{ID_PATH}}=="{_glob_safe(env["ID_PATH"])}"'],
            "udev's ID_PATH (the bus position: stable while the hardware stays where it is)",
            True,
        )
    return (
        [f'KERNEL=="{device}"'],
        f"the kernel name {device}: NOT stable across reboots (no serial, WWID or "
        "path found); replace it with a match from `udevadm info --query=property --name="
        + device
        + "`",
        False,
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
            if attr == "scheduler"
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


# --- the inverse case: what sets the attribute again -------------------------------------------

_TOKEN = re.compile(r'([A-Za-z_]+)(?:\{([^}]*)\})?\s*(==|!=|\+=|-=|:=|=)\s*"((?:[^"\\]|\\.)*)"')


class Setter:
    """A udev rule or a tuned profile line that writes ATTR of a device."""

    def __init__(self, path, line, text, value, again, judged):
        self.path, self.line, self.text, self.value, self.again, self.judged = (
            path,
            line,
            text,
            value,
            again,
            judged,
        )

    def evidence(self, device):
        return f"set by {self.path}:{self.line} ({self.text}): {self.again}{self.judged}"


class Scan:
    """udev's rules and tuned's active profile, read once per doctor run."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._rules = None

    # udev
    def rule_files(self):
        """[(host path, rootfs path)] in udev's order: by file name, the first directory holding a
        name winning (a /etc file linked to /dev/null masks the name)."""
        chosen, seen_dirs = {}, set()
        for d in UDEV_RULES_DIRS:
            real = os.path.realpath(self.ctx.path(d))
            if real in seen_dirs:
                continue  # /lib is /usr/lib on a merged-/usr Debian
            seen_dirs.add(real)
            try:
                names = os.listdir(real)
            except OSError:
                continue
            for name in names:
                if name.endswith(".rules") and name not in chosen:
                    chosen[name] = (f"{d}/{name}", os.path.join(real, name))
        return [chosen[n] for n in sorted(chosen)]

    def rules(self):
        if self._rules is None:
            self._rules = []
            for shown, path in self.rule_files():
                if os.path.realpath(path) == "/dev/null":
                    continue
                text = self.ctx.read(path) or ""
                for lineno, rule in _logical_lines(text):
                    tokens = _TOKEN.findall(rule)
                    if tokens:
                        self._rules.append((shown, lineno, tokens))
        return self._rules

    def setters(self, host, spec):
        """The rules that write a value other than the fix's to the device's attribute, in the order
        udev applies them: ATTR{} assignments as their rule is processed (files by name, lines in
        order), RUN programs after every rule. A bad write that a later, fully judged write of the
        fix's value overrides is named as overridden."""
        device, attr, good = spec["device"], spec["attr"], spec["value"]
        applied = []  # (order, path, line, text, value, judged note)
        for i, (shown, lineno, tokens) in enumerate(self.rules()):
            writes = []
            for key, sub, op, value in tokens:
                if key == "ATTR" and sub == f"queue/{attr}" and op in ("=", ":="):
                    writes.append(((0, i), f'ATTR{{queue/{attr}}}="{value}"', value))
                elif key == "RUN" and op in ("+=", "=", ":="):
                    for m in re.finditer(
                        r"echo\s+['\"]?([\w.-]+)['\"]?\s*>\s*(\S*queue/" + re.escape(attr) + r")\b",
                        value,
                    ):
                        writes.append(((1, i), f'RUN+="...echo {m[1]} > {m[2]}..."', m[1]))
            if not writes:
                continue
            judged = self._judge(host, device, tokens)
            if judged is not None:
                applied += [
                    (order, shown, lineno, text, value, judged) for order, text, value in writes
                ]
        applied.sort(key=lambda a: a[0])
        out = []
        for n, (_, shown, lineno, text, value, judged) in enumerate(applied):
            if value == good:
                continue
            later = [a for a in applied[n + 1 :] if a[4] == good and a[5] == ""]
            again = (
                f"overridden on each event by {later[-1][1]}:{later[-1][2]} ({later[-1][3]}), which runs after it"
                if later
                else "it will set it again on the next add/change event"
            )
            out.append(Setter(shown, lineno, text, value, again, judged))
        return (
            out
            + self.tuned_setters(device, attr, good)
            + self.sysfs_conf_setters(device, attr, good)
        )

    def _judge(self, host, device, tokens):
        """None when the rule cannot apply to the device (its KERNEL, DEVNAME, SUBSYSTEM, ACTION,
        an ATTR it reads or a udev property in the database says so); else '' when every match
        was checked, or a note naming the matches not judged: an approximation (no GOTO/LABEL)."""
        env = None
        unknown = []
        for key, sub, op, value in tokens:
            if op not in ("==", "!="):
                continue
            if key in ("KERNEL", "ENV") and (key == "KERNEL" or sub == "DEVNAME"):
                subject = device if key == "KERNEL" else f"/dev/{device}"
            elif key == "SUBSYSTEM":
                subject = "block"
            elif key == "ACTION":
                if op == "==" and not (_fnmatch_any(value, "add") or _fnmatch_any(value, "change")):
                    return None  # a remove rule, say; ACTION!="add|change", GOTO=... skips other events
                continue
            elif key == "ATTR" and sub:
                subject = self.ctx.sys_attr(device, sub)
            elif key == "ENV" and sub:
                if env is None:
                    env = self.ctx.udev_env(device)
                    env.setdefault(
                        "DEVTYPE",
                        "partition"
                        if host.devices.get(device, {}).get("kind") == "partition"
                        else "disk",
                    )
                subject = env.get(sub)
            else:
                subject = None
            if subject is None:
                unknown.append(f'{key}{"{" + sub + "}" if sub else ""}{op}"{value}"')
                continue
            if _fnmatch_any(value, subject) != (op == "=="):
                return None
        if not unknown:
            return ""
        return f"; whether its {', '.join(unknown)} hold{'s' if len(unknown) == 1 else ''} for {device} was not judged"

    # tuned
    def tuned_profiles(self):
        """[(profile name, host path, rootfs path)] of the active profile(s) and what they include."""
        active = (self.ctx.read(self.ctx.path(TUNED_ACTIVE)) or "").split()
        out, todo, seen = [], list(active), set()
        while todo:
            name = todo.pop(0)
            if name in seen:
                continue
            seen.add(name)
            for d in TUNED_DIRS:
                path = self.ctx.path(f"{d}/{name}/tuned.conf")
                text = self.ctx.read(path)
                if text is not None:
                    out.append((name, f"{d}/{name}/tuned.conf", text))
                    m = re.search(r"^\s*include\s*=\s*(.+)$", text, re.M)
                    if m:
                        todo += [p.strip() for p in re.split(r"[,;\s]+", m[1]) if p.strip()]
                    break
        return out

    def tuned_setters(self, device, attr, good):
        out = []
        for name, shown, text in self.tuned_profiles():
            section, plugin, devices = None, None, None
            for lineno, line in enumerate(text.splitlines(), 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                m = re.match(r"^\[(.+)\]$", line)
                if m:
                    section, plugin, devices = m[1], m[1], None
                    continue
                key, eq, value = line.partition("=")
                if not eq:
                    continue
                key, value = key.strip(), value.strip()
                if key == "type":
                    plugin = value
                elif key == "devices":
                    devices = value
                elif plugin == "sysfs" and fnmatch.fnmatchcase(
                    f"/sys/block/{device}/queue/{attr}", key
                ):
                    if value != good:
                        out.append(
                            self._tuned(name, shown, lineno, f"[{section}] {key}={value}", value)
                        )
                elif (
                    plugin == "disk"
                    and key == TUNED_DISK_OPTIONS.get(attr)
                    and _tuned_devices(devices, device)
                ):
                    if value.split()[0] != good:
                        out.append(
                            self._tuned(name, shown, lineno, f"[{section}] {key}={value}", value)
                        )
        return out

    def sysfs_conf_setters(self, device, attr, good):
        """sysfsutils' /etc/sysfs.conf and /etc/sysfs.d/*.conf: `block/DEV/queue/ATTR = value`,
        a path below /sys (a `mode`/`owner` prefix sets permissions instead)."""
        files = [SYSFS_CONF[0]]
        try:
            files += sorted(
                f"{SYSFS_CONF[1]}/{n}"
                for n in os.listdir(self.ctx.path(SYSFS_CONF[1]))
                if n.endswith(".conf")
            )
        except OSError:
            pass
        out = []
        for shown in files:
            for lineno, line in enumerate(
                (self.ctx.read(self.ctx.path(shown)) or "").splitlines(), 1
            ):
                key, eq, value = line.partition("=")
                key, value = key.strip(), value.strip()
                if (
                    not eq
                    or not key
                    or key.startswith("#")
                    or key.split()[0] in ("mode", "owner")
                    or value == good
                ):
                    continue
                if fnmatch.fnmatchcase(
                    f"block/{device}/queue/{attr}", key.lstrip("/").removeprefix("sys/")
                ):
                    out.append(
                        Setter(
                            shown,
                            lineno,
                            f"{key} = {value}",
                            value,
                            "sysfsutils writes it again at every boot (the sysfsutils service)",
                            "",
                        )
                    )
        return out

    @staticmethod
    def _tuned(name, shown, lineno, text, value):
        return Setter(
            shown,
            lineno,
            text,
            value,
            f"tuned's active profile {name} sets it again whenever tuned starts or applies the profile "
            "(tuned-adm off, or a profile without it)",
            "",
        )


def _tuned_devices(devices, device):
    """tuned's devices= list: comma-separated globs, '!' to exclude; absent means every disk."""
    if not devices:
        return True
    patterns = [p.strip() for p in devices.split(",") if p.strip()]
    verdict = all(p.startswith("!") for p in patterns)  # only exclusions: every other disk
    for pattern in patterns:
        if pattern.startswith("!"):
            if fnmatch.fnmatchcase(device, pattern[1:]):
                return False
        elif fnmatch.fnmatchcase(device, pattern):
            verdict = True
    return verdict


def _fnmatch_any(value, subject):
    """udev's match: '|' separates alternatives, each a glob."""
    return any(fnmatch.fnmatchcase(subject, alt) for alt in value.split("|"))


def _logical_lines(text):
    """(first line number, rule) of a rules file: comments dropped, '\\' continuations joined."""
    out, buf, start = [], "", None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if start is None:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        out.append((start, buf + stripped))
        buf, start = "", None
    if buf:
        out.append((start, buf))
    return out
