"""A role (roles/) run under supervisord in its state directory: `make up`, `make down`,
`make status`, `make logs`. Each program restarts on crash and logs to STATE/logs/NAME.log."""

import json
import os
import shlex
import signal
import subprocess
import time

from . import privileges, procs
from .files import write_if_changed
from .roles import probe
from .stack import VENV_BIN


class Supervisor:
    def __init__(self, state, role=None):
        self.state, self.role = os.path.abspath(state), role

    @property
    def sock(self):
        return os.path.join(self.state, "supervisor.sock")

    @property
    def conf(self):
        return os.path.join(self.state, "supervisord.conf")

    def render(self):
        """The role's configuration, ports.json and supervisord.conf; (supervisord.conf changed,
        the programs to restart)."""
        os.makedirs(os.path.join(self.state, "logs"), exist_ok=True)
        os.makedirs(os.path.join(self.state, "data"), exist_ok=True)
        restart = self.role.render()
        privileges.apply(self.role)
        write_if_changed(
            os.path.join(self.state, "ports.json"),
            json.dumps(self.role.ports, indent=1, sort_keys=True) + "\n",
        )
        return write_if_changed(self.conf, self.supervisord_conf(), private=True), restart

    def supervisord_conf(self):
        s, logs = self.state, os.path.join(self.state, "logs")
        lines = [
            "; rendered by blockstack_deploy/supervisor.py: edit the source, not this file",
            "[unix_http_server]",
            f"file={self.sock}",
            "chmod=0700",
            "",
            "[supervisord]",
            f"logfile={logs}/supervisord.log",
            f"pidfile={s}/supervisord.pid",
            f"childlogdir={logs}",
            "logfile_maxbytes=10MB",
            "logfile_backups=3",
            f"umask={privileges.UMASK:03o}",
            "",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
            "",
            "[supervisorctl]",
            f"serverurl=unix://{self.sock}",
            "",
        ]
        for name, (argv, env, _) in self.role.commands().items():
            # as root: the program's own user and capabilities (privileges.py)
            command = " ".join(shlex.quote(a) for a in privileges.wrap(name, argv)).replace(
                "%", "%%"
            )
            lines += [
                f"[program:{name}]",
                f"command={command}",
                f"directory={s}",
                "autostart=true",
                "autorestart=true",
                "startsecs=1",
                "startretries=100",
                "stopasgroup=true",
                "killasgroup=true",
                "stopwaitsecs=20",
                f"umask={privileges.UMASK:03o}",
                f"stdout_logfile={logs}/{name}.log",
                "redirect_stderr=true",
                "stdout_logfile_maxbytes=10MB",
                "stdout_logfile_backups=3",
            ]
            if env:
                lines.append("environment=" + ",".join(f'{k}="{v}"' for k, v in env.items()))
            lines.append("")
        return "\n".join(lines)

    def pid(self):
        try:
            with open(os.path.join(self.state, "supervisord.pid")) as f:
                pid = int(f.read().strip())
            os.kill(pid, 0)
            return pid
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None

    def program_pid(self, name):
        """The pid of a running program, or None."""
        out = self.ctl("pid", name, check=False).stdout.strip()
        return int(out) if out.isdigit() else None

    def ctl(self, *args, check=True):
        return subprocess.run(
            [os.path.join(VENV_BIN, "supervisorctl"), "-c", self.conf, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
        )

    def up(self, timeout=120):
        """Render, start supervisord or update the running one, wait until every program answers,
        reload what re-reads its configuration, print where to look. A second `up` with nothing
        changed touches nothing."""
        start = time.monotonic()
        running = self.pid() is not None
        conf_changed, restart = self.render()
        if self.pid() is None:
            # its own log is opened before its umask= applies
            subprocess.run(
                [os.path.join(VENV_BIN, "supervisord"), "-c", self.conf],
                check=True,
                timeout=60,
                umask=privileges.UMASK,
            )
            self._wait_sock()
        elif conf_changed:
            self.ctl("reread")
            self.ctl("update")  # restarts only the programs whose command changed
        else:
            self.ctl(
                "start", "all", check=False
            )  # anything stopped by hand comes back; else a no-op
        if running:
            for name in restart:
                self.ctl("restart", name)
        self.wait_healthy(timeout)
        for (
            name
        ) in self.role.reloads:  # rule and target edits apply without a restart; a no-op otherwise
            self.ctl("signal", "HUP", name)
        print("\n".join(self.role.summary(time.monotonic() - start)))

    def _wait_sock(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.sock) and self.ctl("pid", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise TimeoutError(
            "supervisord did not come up; see "
            + os.path.join(self.state, "logs", "supervisord.log")
        )

    def wait_healthy(self, timeout=120):
        deadline = time.monotonic() + timeout
        for name, (_, _, url) in self.role.commands().items():
            # a 2xx, or 401 from a listener with basic auth on (it is up)
            while not probe(url, ca=self.role.ca):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{name} did not answer {url}; see {self.state}/logs/{name}.log"
                    )
                time.sleep(0.2)

    def down(self):
        pid = self.pid()
        if pid is None:
            print("not running")
            return
        self.ctl("stop", "all", check=False)
        os.kill(pid, signal.SIGTERM)
        for _ in range(300):
            if self.pid() is None:
                break
            time.sleep(0.1)
        self._stop_leftovers()
        print(f"stopped; data kept in {self.state}/data")

    def _stop_leftovers(self, grace=10.0):
        """Processes of this stack still running once supervisord is gone (a program slow to exit
        on a loaded host, a child outside its process group): TERM, then KILL after `grace`."""
        left = self.leftovers()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in left:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while left and time.monotonic() < deadline:
                time.sleep(0.1)
                left = [p for p in left if _stat(p)[0] not in ("Z", None)]
            if not left:
                return
            print(f"still running after SIG{sig.name[3:]}: {left}")

    def leftovers(self):
        """Pids with an argument that is, or lies under, this stack's state directory (not merely
        starts like it: `.state-lab` is another stack's), but for this process and its ancestors
        (`make down STATE_DIR=...` names it too)."""
        state = self.state.rstrip("/").encode()
        mine = _ancestors(os.getpid())
        return [
            pid
            for pid, args in procs.cmdlines()
            if pid not in mine and any(a.endswith(state) or state + b"/" in a for a in args)
        ]


def _stat(pid):
    """(state, parent pid) of a process from /proc/PID/stat, or (None, 0) once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, ppid = f.read().rsplit(")", 1)[1].split()[:2]  # the fields after the command
        return state, int(ppid)
    except (OSError, ValueError):
        return None, 0


def _ancestors(pid):
    """pid and the pids of its parent, grandparent, ... up to init."""
    chain = set()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        pid = _stat(pid)[1]
    return chain
