"""What would set a queue attribute again after an operator fixed it by hand: a udev rule, the
active tuned profile or sysfsutils' sysfs.conf, each named with its file and line (the doctor's
evidence under a queue setting's finding, persist.attach)."""

import fnmatch
import os
import re

from .settings import BY_FILE

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
                    and key == BY_FILE[attr].tuned
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
