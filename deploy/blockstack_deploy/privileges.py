"""Least privilege under supervisord (`make up`, `make up-agent`, `make up-central` as root): each
server runs under a system user of its own with only the capabilities it needs, started through
setpriv(1) (util-linux) because supervisord's `user=` can switch the user but not keep a
capability. systemd.py gives the units the same identities (User=, AmbientCapabilities=). No
program runs as uid 0: a process without capabilities but uid 0 still writes root's files.

    program            user                    capabilities (effective = permitted = bounding)
    node_exporter      blockstack-node         none
    blockstack-exporter blockstack-exporter    none; group disk reads the ext4 superblocks. Every
                       (+ group disk)          other path it reads is world-readable: /sys/block,
                                               /proc/fs/ext4/*/options, /proc/fs/jbd2/*/info
    dm helper          blockstack-dm           CAP_SYS_ADMIN (every DM ioctl); only where the kernel
                                               has device-mapper (device_mapper()), else not started.
                                               It clears its ambient set and raises it only in the
                                               dmsetup it runs (dm_helper.py); /dev/mapper/control
                                               gets its group (0660); its socket directory only the
                                               exporter's group enters
    ebpf_exporter      blockstack-ebpf         CAP_BPF, CAP_PERFMON (load BPF programs and attach them
                                               to tp_btf/raw_tp tracepoints: no tracefs, no
                                               CAP_DAC_READ_SEARCH); it drops them all once attached
                                               (--capabilities.keep=none; CAP_BPF kept before 5.19:
                                               stack.ebpf_keep_capabilities). Before 5.11 BPF memory
                                               counts against RLIMIT_MEMLOCK, which libbpf raises:
                                               CAP_SYS_RESOURCE there (kept until attached)
    Prometheus, watchers, blockstack-prometheus      none
    Thanos sidecars
    Alertmanager       blockstack-alertmanager  none
    page receiver      blockstack-receiver      none
    alert gates        blockstack-gate          none
    metrics front      blockstack-front         none (the only one but the exporters that may enter
                                               STATE/run/node and STATE/run/ebpf, their sockets)
    Thanos Query       blockstack-thanos        none
    Grafana            blockstack-grafana       none

No ambient capability on any listener (the helper's is cleared at its start; ebpf_exporter's go
with the rest when it drops them). Each server owns only what it writes (its --storage path, the
receiver's pages directory, Grafana's data), created under umask 027 (UMASK: files 0640,
directories 0750, the logs too); the servers share the group `blockstack`, which may read the
state directory's secrets (0640) and rendered configuration. Not root: everything runs as the
invoking user, as before.
"""

import grp
import os
import pwd
import re
import stat
import subprocess

GROUP = "blockstack"
FRONT = "blockstack-front"  # its group alone enters the exporters' socket directories


def _before(major, minor, release=None):
    """Whether this host's kernel (or the kernel `release`) is older than major.minor."""
    m = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    return bool(m) and (int(m[1]), int(m[2])) < (major, minor)


def _ebpf_capabilities(release=None):
    """ebpf_exporter's capabilities on this host's kernel (or the kernel `release`: a VM lab
    guest's). Before 5.11 BPF maps count against RLIMIT_MEMLOCK, which libbpf raises:
    CAP_SYS_RESOURCE there."""
    return ("bpf", "perfmon", *(("sys_resource",) if _before(5, 11, release) else ()))


# (user, extra groups, capabilities) by kind of program (its name before the first "-")
IDENTITIES = {
    "node": ("blockstack-node", (), ()),
    "blockstack": ("blockstack-exporter", ("disk",), ()),
    "dm": ("blockstack-dm", (), ("sys_admin",)),  # dm_helper.py
    "ebpf": ("blockstack-ebpf", (), _ebpf_capabilities()),
    "prometheus": ("blockstack-prometheus", (GROUP,), ()),
    "watcher": ("blockstack-prometheus", (GROUP,), ()),
    "sidecar": ("blockstack-prometheus", (GROUP,), ()),  # reads its Prometheus's TSDB
    "alertmanager": ("blockstack-alertmanager", (GROUP,), ()),
    "receiver": ("blockstack-receiver", (GROUP,), ()),
    "gate": ("blockstack-gate", (GROUP,), ()),  # the fleet's alert gates (alert_gate.py)
    "front": (FRONT, (), ()),  # /metrics of node_exporter and ebpf_exporter (metrics_front.py)
    "query": ("blockstack-thanos", (GROUP,), ()),
    "grafana": ("blockstack-grafana", (GROUP,), ()),
}
# Who may enter a program's socket directory (Role.sockets): the front, but the dm helper's the exporter.
SOCKET_CLIENTS = {"dm": "blockstack-exporter"}
UMASK = 0o027  # every program's (supervisord's umask=, systemd's UMask=): nothing it writes is world-readable
DM_CONTROL = "/dev/mapper/control"
# Flags naming the directory a server writes.
WRITES = ("--storage.tsdb.path=", "--storage.path=", "--tsdb.path=")


def enabled():
    return os.geteuid() == 0


def device_mapper():
    """Whether this kernel has device-mapper (its control node and its major): else no dm helper
    runs and nothing holds CAP_SYS_ADMIN. A dm module loaded later takes another `make up`."""
    try:
        with open("/proc/devices") as f:
            return os.path.exists(DM_CONTROL) and "device-mapper" in f.read().split()
    except OSError:
        return False


def identity(program, release=None):
    """(user, extra groups, capabilities) of a program; `release`: those it gets on another
    kernel than this host's (a VM lab guest's, where ebpf_exporter's depend on it)."""
    kind = program.split("-")[0]
    user, groups, caps = IDENTITIES[kind]
    if release and kind == "ebpf":
        caps = _ebpf_capabilities(release)
    return user, groups, caps


def wrap(program, argv, release=None):
    """argv run under the program's user and capabilities (unchanged when not root); `release`
    as in identity()."""
    if not enabled():
        return list(argv)
    user, groups, caps = identity(program, release)
    caps_list = ",".join(f"+{c}" for c in caps)
    prefix = [
        "setpriv",
        "--no-new-privs",
        "--inh-caps=-all" + ("," + caps_list if caps else ""),
        "--bounding-set=-all" + ("," + caps_list if caps else ""),
        f"--reuid={user}",
        f"--regid={user}",
        "--groups=" + ",".join(groups) if groups else "--clear-groups",
    ]
    if caps:  # ambient: a program without file capabilities keeps them across exec only so
        prefix.append(f"--ambient-caps={caps_list}")
    return prefix + ["--", *argv]


def ensure_users():
    """The group and the system users of IDENTITIES (idempotent)."""
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", "--system", GROUP], check=True, timeout=60)
    for user, _, _ in sorted(set(IDENTITIES.values())):  # one order: uids alike on every host
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--home-dir",
                    "/nonexistent",
                    "--shell",
                    "/usr/sbin/nologin",
                    "--user-group",
                    user,
                ],
                check=True,
                timeout=60,
            )


def chown(path, user, group=None, recursive=False):
    uid = pwd.getpwnam(user).pw_uid
    gid = grp.getgrnam(group).gr_gid if group else pwd.getpwnam(user).pw_gid
    paths = [path]
    if recursive:
        paths += [os.path.join(top, n) for top, dirs, files in os.walk(path) for n in dirs + files]
    for p in paths:
        os.lchown(p, uid, gid)


def private(path):
    """Nothing under path readable, writable or searchable by others: what older installs (before
    UMASK) left world-readable."""
    if not os.path.isdir(path):
        return
    for p in [path] + [
        os.path.join(top, n) for top, dirs, files in os.walk(path) for n in dirs + files
    ]:
        mode = os.lstat(p).st_mode
        if mode & 0o007 and not stat.S_ISLNK(mode) and not stat.S_ISSOCK(mode):
            os.chmod(p, stat.S_IMODE(mode) & ~0o007)


def apply(role):
    """For a role (roles/) about to start as root: the users made; every program's written
    directory owned by its user (its --storage path, role.owned: the receiver's pages directory,
    Grafana's data) and closed to others, as the logs; the socket directories entered by their
    clients' group alone; the control node of device-mapper opened by the dm helper's group; the
    state directory's secrets (and the fleet's, wherever they are) and configuration readable by
    the group, not by others."""
    if not enabled():
        return
    ensure_users()
    state = role.state
    commands = role.commands()
    for name, (argv, _, _) in commands.items():
        user = identity(name)[0]
        for arg in argv:
            for flag in WRITES:
                if arg.startswith(flag) and name.split("-")[0] != "sidecar":
                    os.makedirs(arg[len(flag) :], exist_ok=True)
                    chown(arg[len(flag) :], user, recursive=True)
                    private(arg[len(flag) :])
    for name, path in role.owned:
        os.makedirs(path, exist_ok=True)
        chown(path, identity(name)[0], recursive=True)
        private(path)
    private(os.path.join(state, "logs"))
    for name, path in role.sockets:
        os.makedirs(path, exist_ok=True)
        chown(
            path,
            identity(name)[0],
            group=SOCKET_CLIENTS.get(name.split("-")[0], FRONT),
            recursive=True,
        )
        os.chmod(path, 0o750)
    if "dm" in commands and os.path.exists(DM_CONTROL):
        # root's 0600 otherwise; opening it gives nothing without CAP_SYS_ADMIN (dm-ioctl.c ctl_ioctl)
        os.chown(DM_CONTROL, 0, grp.getgrnam(identity("dm")[0]).gr_gid)
        os.chmod(DM_CONTROL, 0o660)
    gid = grp.getgrnam(GROUP).gr_gid
    if os.path.isdir(role.data):  # the servers' data directories: the group passes, others do not
        os.chown(role.data, 0, gid)
        os.chmod(role.data, 0o750)
    secrets = getattr(role, "secrets", None)
    for top in [os.path.join(state, "secrets"), os.path.join(state, "config")] + (
        [secrets.dir] if secrets else []
    ):
        if not os.path.isdir(top):
            continue
        for d, _dirs, files in os.walk(top):
            os.chown(d, 0, gid)
            os.chmod(d, 0o750)
            for f in files:
                p = os.path.join(d, f)
                if (
                    os.stat(p).st_uid == 0 and f != "ca.key"
                ):  # no server signs; a server's own files stay its
                    os.chown(p, 0, gid)
                    os.chmod(p, os.stat(p).st_mode & 0o750 | 0o040)
    os.chmod(state, 0o755)
