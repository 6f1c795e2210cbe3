"""systemd units rendered from the commands a role gives supervisord (`make install-systemd`):
the same argv, one unit per program, with the identity `make up` gives it (privileges.IDENTITIES:
User=, SupplementaryGroups=, CapabilityBoundingSet= and AmbientCapabilities= from the same table,
UMask= from privileges.UMASK) and the sandboxing of its kind.

node_exporter and blockstack-exporter hold no capability; the dm helper (only where the kernel has
device-mapper) CAP_SYS_ADMIN for the DM ioctls, on no network; ebpf_exporter what loading and
attaching tracepoint programs needs, dropped once attached. The servers (Prometheus,
Alertmanager, the page receiver, Thanos, Grafana) run each as its own system user without
capabilities, in the group `blockstack` that reads the state directory's configuration and
secrets; each owns only what it writes.
"""

import os
import re
import string
import subprocess

from . import metrics_front, privileges
from .files import write_if_changed

UNIT_DIR = "/etc/systemd/system"
# Unit names of the exporters (blockstack-NAME.service for the rest).
UNIT_NAMES = {
    "node": "node-exporter",
    "blockstack": "exporter",
    "ebpf": "ebpf-exporter",
    "receiver": "page-receiver",
    "dm": "dm-helper",
}

UNIT = string.Template("""\
# rendered by blockstack_deploy/systemd.py from the ${role} role's command: edit the source, not this file
[Unit]
Description=Block Stack Merges ${name}
After=${after}
${requires}
[Service]
${environment}ExecStart=${exec_start}
${reload}${hardening}
NoNewPrivileges=yes
ProtectSystem=strict
PrivateTmp=yes
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
""")

# Who each program is (privileges.IDENTITIES, as under `make up`).
IDENTITY = string.Template("""\
User=${user}
Group=${user}
SupplementaryGroups=${groups}
CapabilityBoundingSet=${caps}
AmbientCapabilities=${caps}
UMask=${umask}""")
# The sandboxing per kind of program (its name before the first "-": prometheus-A is a prometheus).
HARDENING = {
    "node": """\
ProtectHome=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX""",
    # sysfs/procfs and ext4 superblocks (group disk); device-mapper through the dm helper's socket;
    # it can write nothing.
    "blockstack": """\
ProtectHome=read-only
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
DevicePolicy=closed
DeviceAllow=block-* r
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
RestrictNamespaces=yes
LockPersonality=yes
SystemCallArchitectures=native""",
    # the DM ioctls on /dev/mapper/control, a Unix socket in its own directory, no network at all
    "dm": """\
ReadWritePaths=${state}/run/dm
ProtectHome=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
PrivateNetwork=yes
DevicePolicy=closed
DeviceAllow=/dev/mapper/control rw
RestrictAddressFamilies=AF_UNIX
RestrictNamespaces=yes
LockPersonality=yes
SystemCallArchitectures=native""",
    "ebpf": """\
ProtectHome=read-only
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
LockPersonality=yes""",
}
# An exporter that serves its metrics on a Unix socket (stack.Stack.metrics_socket_dir): systemd
# makes the socket and hands it over as fd 3, which metrics_front.py's `exec` does under supervisord;
# only root and the front's group may connect.
SOCKET = string.Template("""\
# rendered by blockstack_deploy/systemd.py from the ${role} role's command: edit the source, not this file
[Unit]
Description=Block Stack Merges ${name} metrics socket (metrics_front.py answers its port)

[Socket]
ListenStream=${path}
SocketMode=0660
SocketGroup=${group}
RemoveOnStop=yes

[Install]
WantedBy=sockets.target
""")
SERVER = """\
ReadWritePaths=${state}
ProtectHome=read-only"""


def escape(arg):
    """One ExecStart word: backslash, % (specifiers) and $ (variables) escaped, quoted if it has
    blanks or quotes (systemd.service "Command lines")."""
    arg = arg.replace("\\", "\\\\").replace("%", "%%").replace("$", "$$")
    if not arg or re.search(r"[\s\"']", arg):
        return '"' + arg.replace('"', '\\"') + '"'
    return arg


def unit_name(program):
    return f"blockstack-{UNIT_NAMES.get(program, program)}.service"


def units(role):
    """{unit file name: text} for every program of the role (and a .socket for a socketed exporter)."""
    out = {}
    for name, (argv, env, _) in role.commands().items():
        kind = name.split("-")[0]
        if argv[1:3] == [metrics_front.__file__, "exec"]:  # systemd makes the socket itself
            path = argv[3].split("=", 1)[1]
            argv = argv[argv.index("--") + 1 :]
            socket_unit = unit_name(name).replace(".service", ".socket")
            out[socket_unit] = SOCKET.substitute(
                role=role.name, name=UNIT_NAMES.get(name, name), path=path, group=privileges.FRONT
            )
            requires = f"Requires={socket_unit}\nAfter={socket_unit}\n"
        else:
            requires = ""
        user, groups, caps = privileges.identity(name)
        hardening = (
            IDENTITY.substitute(
                user=user,
                groups=" ".join(groups),
                caps=" ".join(f"CAP_{c.upper()}" for c in caps),
                umask=f"{privileges.UMASK:04o}",
            )
            + "\n"
            + string.Template(HARDENING.get(kind, SERVER)).substitute(state=role.state)
        )
        run = os.path.dirname(getattr(getattr(role, "stack", None), "self_pages_file", ""))
        if name == "receiver-self" and run.startswith(
            "/run/"
        ):  # read-only under ProtectSystem: systemd makes it
            hardening += f"\nRuntimeDirectory={run[len('/run/') :]}\nRuntimeDirectoryPreserve=yes"
        out[unit_name(name)] = UNIT.substitute(
            role=role.name,
            name=UNIT_NAMES.get(name, name),
            requires=requires,
            after="local-fs.target" if kind in HARDENING else "network-online.target",
            environment="".join(f"Environment={escape(f'{k}={v}')}\n" for k, v in env.items()),
            exec_start=" ".join(escape(a) for a in argv),
            reload="ExecReload=/bin/kill -HUP $MAINPID\n" if name in role.reloads else "",
            hardening=hardening,
        )
    return out


def install(role, unit_dir=UNIT_DIR):
    """Render the role's configuration and units, make the user, enable and start every unit."""
    if not os.path.isdir("/run/systemd/system"):
        raise SystemExit(
            "systemd is not running on this host (make up runs the stack under supervisord)"
        )
    os.makedirs(role.data, exist_ok=True)
    role.render()
    privileges.apply(role)  # the users, what each owns, the group's secrets
    rendered = units(role)
    for name, text in rendered.items():
        write_if_changed(os.path.join(unit_dir, name), text)
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    subprocess.run(["systemctl", "enable", "--now", *rendered], check=True)
    print("installed: " + " ".join(rendered))
