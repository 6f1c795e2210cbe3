"""Least privilege under supervisord (`make up`, `make up-agent`, `make up-central` as root): each
server runs under a system user of its own with only the capabilities it needs, started through
setpriv(1) (util-linux) because supervisord's `user=` can switch the user but not keep a
capability. systemd.py gives the units the same identities (User=, AmbientCapabilities=).

    program            user                    capabilities (effective = permitted = bounding)
    node_exporter      blockstack-node         none
    blockstack-exporter blockstack-exporter    CAP_SYS_ADMIN (device-mapper ioctls of `dmsetup
                       (+ group disk)          status`), CAP_DAC_READ_SEARCH (sysfs/debugfs paths
                                               root alone may search); ambient, so dmsetup has them
    ebpf_exporter      root                    CAP_BPF, CAP_PERFMON (load and attach tracepoint
                                               programs), CAP_DAC_READ_SEARCH (tracefs event ids); it
                                               drops them all once attached (--capabilities.keep=none;
                                               CAP_BPF kept before 5.19: stack.ebpf_keep_capabilities).
                                               No CAP_SYS_RESOURCE from 5.11 on: BPF memory is charged
                                               to the cgroup, not the memlock limit (before: kept)
    Prometheus, watchers, blockstack-prometheus      none
    Thanos sidecars
    Alertmanager       blockstack-alertmanager  none
    page receiver      blockstack-receiver      none
    alert gates        blockstack-gate          none
    metrics front      blockstack-front         none (the only one but the exporters that may enter
                                               STATE/run/node and STATE/run/ebpf, their sockets)
    Thanos Query       blockstack-thanos        none
    Grafana            blockstack-grafana       none

Each server owns only what it writes (its --storage path, the receiver's pages directory,
Grafana's data); the servers share the group `blockstack`, which may read the state directory's
secrets (0640) and rendered configuration. Not root: everything runs as the invoking user, as before.
"""
import grp
import os
import pwd
import re
import subprocess

GROUP = "blockstack"
FRONT = "blockstack-front"  # its group alone enters the exporters' socket directories
def _before(major, minor):
    """Whether this host's kernel is older than major.minor."""
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return bool(m) and (int(m[1]), int(m[2])) < (major, minor)


# (user, extra groups, capabilities) by kind of program (its name before the first "-")
IDENTITIES = {
    "node": ("blockstack-node", (), ()),
    "blockstack": ("blockstack-exporter", ("disk",), ("sys_admin", "dac_read_search")),
    # before 5.11 BPF maps count against RLIMIT_MEMLOCK, which libbpf raises: CAP_SYS_RESOURCE
    "ebpf": ("root", (), ("bpf", "perfmon", "dac_read_search", *(("sys_resource",) if _before(5, 11) else ()))),
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
# Flags naming the directory a server writes.
WRITES = ("--storage.tsdb.path=", "--storage.path=", "--tsdb.path=")


def enabled():
    return os.geteuid() == 0


def identity(program):
    return IDENTITIES[program.split("-")[0]]


def wrap(program, argv):
    """argv run under the program's user and capabilities (unchanged when not root)."""
    if not enabled():
        return list(argv)
    user, groups, caps = identity(program)
    caps_list = ",".join(f"+{c}" for c in caps)
    prefix = ["setpriv", "--no-new-privs", "--inh-caps=-all" + ("," + caps_list if caps else ""),
              "--bounding-set=-all" + ("," + caps_list if caps else "")]
    if user != "root":
        prefix += [f"--reuid={user}", f"--regid={user}",
                   "--groups=" + ",".join(groups) if groups else "--clear-groups"]
        if caps:
            prefix.append(f"--ambient-caps={caps_list}")
    return prefix + ["--", *argv]


def ensure_users():
    """The group and the system users of IDENTITIES (idempotent)."""
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", "--system", GROUP], check=True, timeout=60)
    for user, _, _ in set(IDENTITIES.values()):
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/usr/sbin/nologin", "--user-group", user], check=True, timeout=60)


def chown(path, user, group=None, recursive=False):
    uid = pwd.getpwnam(user).pw_uid
    gid = grp.getgrnam(group).gr_gid if group else pwd.getpwnam(user).pw_gid
    paths = [path]
    if recursive:
        paths += [os.path.join(top, n) for top, dirs, files in os.walk(path) for n in dirs + files]
    for p in paths:
        os.lchown(p, uid, gid)


def apply(role):
    """For a role (roles.py) about to start as root: the users made; every program's written
    directory owned by its user (its --storage path, role.owned: the receiver's pages directory,
    Grafana's data); the state directory's secrets (and the fleet's, wherever they are) and
    configuration readable by the group, not by others."""
    if not enabled():
        return
    ensure_users()
    state = role.state
    for name, (argv, _, _) in role.commands().items():
        user = identity(name)[0]
        for arg in argv:
            for flag in WRITES:
                if arg.startswith(flag) and user != "root" and name.split("-")[0] != "sidecar":
                    os.makedirs(arg[len(flag):], exist_ok=True)
                    chown(arg[len(flag):], user, recursive=True)
    for name, path in role.owned:
        os.makedirs(path, exist_ok=True)
        chown(path, identity(name)[0], recursive=True)
    for name, path in role.sockets:
        os.makedirs(path, exist_ok=True)
        chown(path, identity(name)[0], group=FRONT, recursive=True)
        os.chmod(path, 0o750)
    gid = grp.getgrnam(GROUP).gr_gid
    secrets = getattr(role, "secrets", None)
    for top in [os.path.join(state, "secrets"), os.path.join(state, "config")] + ([secrets.dir] if secrets else []):
        if not os.path.isdir(top):
            continue
        for d, dirs, files in os.walk(top):
            os.chown(d, 0, gid)
            os.chmod(d, 0o750)
            for f in files:
                p = os.path.join(d, f)
                if os.stat(p).st_uid == 0 and f != "ca.key":  # no server signs; a server's own files stay its
                    os.chown(p, 0, gid)
                    os.chmod(p, os.stat(p).st_mode & 0o750 | 0o040)
    os.chmod(state, 0o755)
