"""Privilege that matches the need (privileges.py), shown on a real `make up`: for every running
program, the identity read from /proc/PID/status (uid, gid, groups, capabilities) is reproduced
with setpriv and made to read a root-only file and to write root's files: every attempt fails.
No program runs as uid 0 or holds an ambient capability; what the servers write (TSDB and WAL,
Alertmanager's state, pages, logs) is not world-readable; ebpf_exporter, a capability-less
system user once attached, still counts a loop device's requests, and blockstack-exporter, with
none at all, still reads ext4 and jbd2."""

import os
import pathlib
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile

import pytest

from blockstack_deploy import files, privileges
from blockstack_deploy.supervisor import Supervisor
from blockstack_lab import loop
from blockstack_lab.api import request
from blockstack_testsupport import procs

pytestmark = [pytest.mark.root, pytest.mark.servers]
EXPORTER_TESTS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "exporters", "tests"
)

CAP_NAMES = subprocess.run(
    ["setpriv", "--list-caps"], capture_output=True, text=True, check=True
).stdout.split()
STATUS_FIELDS = (
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
)


def running(state):
    """{program: pid} of everything supervisord runs."""
    out = Supervisor(state).ctl("status", check=False).stdout
    found = dict(re.findall(r"^(\S+)\s+RUNNING\s+pid (\d+)", out, re.M))
    return {name: int(pid) for name, pid in found.items()}


def status(pid):
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    return {k: fields[k].strip() for k in STATUS_FIELDS}


def caps(mask):
    """setpriv's names of the capabilities in a /proc/PID/status mask."""
    return [name for bit, name in enumerate(CAP_NAMES) if int(mask, 16) >> bit & 1]


def as_identity(st, command):
    """command (a shell line) run as st's uid, gid and groups with its effective capabilities; its exit code."""
    effective = ",".join(f"+{c}" for c in caps(st["CapEff"]))
    groups = st["Groups"].split()
    argv = [
        "setpriv",
        f"--reuid={st['Uid'].split()[0]}",
        f"--regid={st['Gid'].split()[0]}",
        f"--groups={','.join(groups)}" if groups else "--clear-groups",
        "--inh-caps=-all" + ("," + effective if effective else ""),
        *([f"--ambient-caps={effective}"] if effective else []),
        "--no-new-privs",
        "--",
        "sh",
        "-c",
        command,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).returncode


def world_accessible(top):
    """Paths under top that others may read, write or search (sockets aside: their directory decides)."""
    found = []
    for d, _, names in os.walk(top):
        for p in [d] + [os.path.join(d, n) for n in names]:
            mode = os.lstat(p).st_mode
            if mode & 0o007 and not stat.S_ISSOCK(mode) and not stat.S_ISLNK(mode):
                found.append(f"{p} {stat.filemode(mode)}")
    return found


def test_every_program_fails_to_read_or_write_roots_files(state):
    state_dir, ports, make = state
    make("up")
    programs = running(state_dir)
    assert {"node", "blockstack", "ebpf", "front", "receiver", "alertmanager", "prometheus"} <= set(
        programs
    ), programs
    seen = {name: status(pid) for name, pid in programs.items()}
    table = subprocess.run(
        ["ps", "-o", "user:24,pid,args", "-p", ",".join(map(str, programs.values()))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    print("\n" + "\n".join(line[:150] for line in table.splitlines()))
    for name, st in sorted(seen.items()):
        print(
            f"{name:<14} uid {st['Uid'].split()[0]:<5} groups {st['Groups'] or '-':<8} CapEff {st['CapEff']} "
            f"CapAmb {st['CapAmb']} CapBnd {st['CapBnd']}"
        )

    # no uid 0 (a capability-less root still writes root's files), no ambient capability on any
    # listener, no_new_privs everywhere; without device-mapper (this host) no capability at all
    assert {n: st["Uid"].split()[0] for n, st in seen.items() if st["Uid"].split()[0] == "0"} == {}
    assert {n: st["CapAmb"] for n, st in seen.items() if int(st["CapAmb"], 16)} == {}
    assert {n for n, st in seen.items() if st["NoNewPrivs"] != "1"} == set()
    allowed = {"dm": ["sys_admin"]}  # the dm helper, where the kernel has device-mapper
    assert {
        n: caps(st["CapEff"]) for n, st in seen.items() if caps(st["CapEff"]) != allowed.get(n, [])
    } == {}

    with tempfile.TemporaryDirectory(prefix="blockstack-root-") as root:
        os.chmod(root, 0o755)  # any user may look inside; only root may write here
        secret, owned = os.path.join(root, "secret"), os.path.join(root, "owned")
        for path, mode in ((secret, 0o600), (owned, 0o644)):
            with open(path, "w") as f:
                f.write("root's\n")
            os.chmod(path, mode)
        attempts = {
            "read a root-only file": f"cat {secret}",
            "write a root-owned file": f": >> {owned}",
            "create a file in a root-owned directory (as in /etc/cron.d)": f": > {root}/new",
            "write supervisord.conf": f": >> {state_dir}/supervisord.conf",
        }
        succeeded = {
            (name, what)
            for name, st in seen.items()
            for what, command in attempts.items()
            if as_identity(st, command) == 0
        }
        assert succeeded == set(), succeeded
        assert not os.path.exists(os.path.join(root, "new"))
        # the attempts can succeed: root's do, and a capability-less uid 0 (ebpf_exporter's identity
        # before) still writes root's files
        assert [
            subprocess.run(["sh", "-c", c], capture_output=True, timeout=30).returncode
            for c in attempts.values()
        ] == [0] * len(attempts)
        assert (
            as_identity(
                {"Uid": "0", "Gid": "0", "Groups": "", "CapEff": "0"},
                attempts["write a root-owned file"],
            )
            == 0
        )

    # what the servers write: 0640 files, 0750 directories (umask 027), nothing for others
    os.chmod(state_dir, 0o755)  # mkdtemp's 0700 would hide what is beneath from the check below
    exposed = [
        p
        for top in ("data", "pages", "logs", "grafana", "secrets", "config")
        for p in world_accessible(os.path.join(state_dir, top))
    ]
    assert exposed == [], exposed
    wal = os.path.join(state_dir, "data", "prometheus", "wal")
    segments = [os.path.join(wal, f) for f in os.listdir(wal)]
    assert segments and all(stat.S_IMODE(os.stat(s).st_mode) == 0o640 for s in segments), segments
    nobody = {"Uid": "65534", "Gid": "65534", "Groups": "", "CapEff": "0"}
    assert as_identity(nobody, f"cat {segments[0]} > /dev/null") != 0, (
        "the WAL is readable past basic auth"
    )

    # one password per server; Grafana's datasource names Prometheus's file, holds no copy, and works
    admin = ("admin", files.secret(os.path.join(state_dir, "secrets", "admin-password")))
    silencer = (
        "alertmanager",
        files.secret(os.path.join(state_dir, "secrets", "alertmanager-password")),
    )
    assert admin[1] != silencer[1]
    provisioning = os.path.join(state_dir, "config", "grafana-provisioning")
    holding = [
        str(p)
        for p in pathlib.Path(provisioning).rglob("*")
        if p.is_file() and admin[1] in p.read_text()
    ]
    assert holding == [], holding
    health = request(
        f"http://127.0.0.1:{ports['grafana']}/api/datasources/uid/blockstack-prometheus/health",
        ("admin", files.secret(os.path.join(state_dir, "secrets", "grafana-admin-password"))),
    )
    assert health[0] == 200 and '"status":"OK"' in health[1], health

    # a silence (Alertmanager's state) written under the same umask
    silence = {
        "matchers": [{"name": "alertname", "value": "BlockStackPrivilegeTest", "isRegex": False}],
        "startsAt": "2020-01-01T00:00:00Z",
        "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "test",
        "comment": "test",
    }
    assert (
        request(
            f"http://127.0.0.1:{ports['alertmanager']}/api/v2/silences", silencer, body=silence
        )[0]
        == 200
    )

    # dropped capabilities, and still at work: ebpf_exporter counts a loop device's reads,
    # blockstack-exporter reads its ext4 options and jbd2 journal
    with loop.attached(64 << 20) as dev, loop.ext4(dev) as mnt:
        name = loop.name(dev)
        with open(os.path.join(mnt, "f"), "wb") as f:
            f.write(os.urandom(4 << 20))
            os.fsync(f.fileno())
        subprocess.run(
            ["dd", f"if={dev}", "of=/dev/null", "bs=1M", "count=32", "iflag=direct"],
            check=True,
            capture_output=True,
            timeout=60,
        )

        def ebpf_counted():
            text = request(f"http://127.0.0.1:{ports['ebpf']}/metrics")[1]
            return re.search(
                rf'^ebpf_exporter_block_rq_size_bytes_count{{devno="{devno(dev)}",operation="read"}} [1-9]',
                text,
                re.M,
            )

        procs.wait_until("ebpf_exporter counting the loop device's reads", ebpf_counted, 60)

        def exporter_read():
            text = request(f"http://127.0.0.1:{ports['blockstack']}/metrics")[1]
            return (
                f'blockstack_jbd2_transactions_total{{device="{name}"' in text
                and f'blockstack_ext4_option_info{{device="{name}"' in text
            )

        procs.wait_until("blockstack-exporter reading ext4 and jbd2", exporter_read, 60)

    make("down")  # Alertmanager writes its silences and nflog snapshots when it stops
    am = os.path.join(state_dir, "data", "alertmanager")
    assert "silences" in os.listdir(am) and world_accessible(am) == [], os.listdir(am)


def devno(dev):
    """The kernel's new_encode_dev() of a block device, as ebpf_exporter's devno label."""
    rdev = os.stat(dev).st_rdev
    major, minor = os.major(rdev), os.minor(rdev)
    return (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)


def test_the_dm_helper_alone_holds_cap_sys_admin_and_only_the_exporter_reaches_it():
    """The dm helper as make up starts it where the kernel has device-mapper (this host has none:
    fake_dmsetup stands in, hung so that its identity can be read): CAP_SYS_ADMIN effective but
    not ambient in the helper, ambient only in the dmsetup it runs; its socket directory entered
    by the exporter's user alone; root's files out of its reach all the same."""
    privileges.ensure_users()
    with tempfile.TemporaryDirectory(prefix="blockstack-dm-") as tmp:
        os.chmod(
            tmp, 0o755
        )  # the helper's and the exporter's users pass (pytest's tmp_path is under a 0700 directory)
        dm_helper_as_make_up_starts_it(pathlib.Path(tmp))


def dm_helper_as_make_up_starts_it(tmp_path):
    run = tmp_path / "dm"
    run.mkdir()
    privileges.chown(str(run), "blockstack-dm", group=privileges.SOCKET_CLIENTS["dm"])
    run.chmod(0o750)
    sock = str(run / "helper.sock")
    shutil.copy(
        os.path.join(EXPORTER_TESTS, "fake_dmsetup"), tmp_path / "dmsetup"
    )  # where the helper's user may run it
    fixtures = tmp_path / "fixtures"
    shutil.copytree(os.path.join(EXPORTER_TESTS, "fixtures", "dm", "nvme-incident"), fixtures)
    env = dict(
        os.environ,
        FAKE_DMSETUP_FIXTURES=str(fixtures),
        FAKE_DMSETUP_MODE="hang",
        FAKE_DMSETUP_SLEEP="20",
    )
    argv = privileges.wrap(
        "dm",
        [
            sys.executable,
            "-I",
            "-m",
            "blockstack_exporter.dm_helper",
            f"--socket={sock}",
            f"--dmsetup={tmp_path / 'dmsetup'}",
            "--timeout=20",
        ],
    )
    helper = subprocess.Popen(argv, env=env)
    child = None
    try:
        procs.wait_until("the helper's socket", lambda: os.path.exists(sock), 30, 0.1)
        st = status(helper.pid)
        assert (st["Uid"].split()[0], caps(st["CapEff"]), st["CapAmb"]) == (
            str(pwd.getpwnam("blockstack-dm").pw_uid),
            ["sys_admin"],
            "0" * 16,
        ), st
        # a request; its dmsetup hangs, so its identity can be read
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(sock)
        client.sendall(b"table\n")
        # the child once it runs dmsetup: between fork and exec it has not raised its ambient set yet
        child = procs.wait_until(
            "the dmsetup child",
            lambda: [
                int(p)
                for p in subprocess.run(
                    ["pgrep", "-P", str(helper.pid), "-f", f"^/bin/sh {tmp_path}/dmsetup "],
                    capture_output=True,
                    text=True,
                ).stdout.split()
            ],
            10,
            0.1,
        )[0]
        dmsetup = status(child)
        client.close()
        assert (caps(dmsetup["CapEff"]), caps(dmsetup["CapAmb"])) == (
            ["sys_admin"],
            ["sys_admin"],
        ), dmsetup
        with tempfile.TemporaryDirectory(prefix="blockstack-root-") as root:
            os.chmod(root, 0o755)
            with open(os.path.join(root, "secret"), "w") as f:
                f.write("root's\n")
            os.chmod(os.path.join(root, "secret"), 0o600)
            for who in (st, dmsetup):
                assert (
                    as_identity(who, f"cat {root}/secret") != 0
                    and as_identity(who, f": > {root}/new") != 0
                )
        # the socket: the exporter's user gets in, any other user does not
        # (the system's python3: the venv's interpreter may lie where these users cannot exec it from a shell)
        python = shutil.which("python3", path="/usr/bin:/bin")
        connect = f"{python} -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{sock}\")'"
        for user, expected in (("blockstack-exporter", 0), ("blockstack-node", 1), ("nobody", 1)):
            u = pwd.getpwnam(user)
            assert (
                as_identity(
                    {"Uid": str(u.pw_uid), "Gid": str(u.pw_gid), "Groups": "", "CapEff": "0"},
                    connect,
                )
                != 0
            ) == bool(expected), user
    finally:
        helper.terminate()
        helper.wait(10)
        if child:  # the hung dmsetup, in a session of its own
            try:
                os.killpg(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
