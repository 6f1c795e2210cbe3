#!/usr/bin/env python3
"""Run the Block Stack Merges stack on this host under supervisord.

    stackctl.py up [--state DIR] [--port NAME=PORT ...] [--listen ADDR] [--auth] [--tls-cert F --tls-key F [--tls-ca F]]
                   [--servers debian|upstream]
    stackctl.py down | status | logs [NAME] | clean | render      (all take --state)
    stackctl.py up --role agent --host NAME --listen ADDR --alertmanager ADDR:PORT ... [--replica A ...]
    stackctl.py up --role central --listen ADDR [--inventory FILE] [--cluster-peer ADDR:PORT ...]
    stackctl.py fleet-cert --host NAME --address ADDR      (on the central side: a host's TLS certificate)

`up` renders the configuration into the state directory, starts supervisord there (or updates
the one already running), waits until every component's health endpoint answers and prints
where to look. A second `up` with nothing changed touches nothing. `down` stops everything and
keeps the data; `clean` also removes the state directory.

Everything listens on 127.0.0.1. `--listen 0.0.0.0` exposes Prometheus and Alertmanager (and
Grafana) only with basic auth over TLS: a generated password (user admin) kept 0600 in
STATE/secrets, hashed into a Prometheus-family `--web.config.file`, and a certificate from a CA
made there (fleet/pki.py); Prometheus, Grafana and stackctl itself use both. `--auth` turns the
same on for the loopback listeners (README "Security"). Exposure comes from these flags only,
never from the environment. Exporters always stay on loopback.

Roles (docs/fleet.md; fleet/roles.py renders them): `--role agent` runs the exporters, one
Prometheus per `--replica` evaluating alerts/*.rules.yml and a Thanos sidecar each on `--listen`
(TLS + basic auth, gRPC mutual TLS); `--role central` runs Thanos Query (Grafana's datasource),
two Alertmanager peers in a cluster on `--listen` (TLS + basic auth), the watcher Prometheus
(BlockStackHostDown) and the page receiver. The default role is the single-host stack above.
"""
import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "lab"))
sys.path.insert(0, REPO)  # fleet/ (the fleet roles)

from blockstack_lab import grafana as grafana_runtime  # noqa: E402
from blockstack_lab.stack import COMPONENTS, DEFAULT_SERVERS, SERVERS, Stack, servers_name  # noqa: E402
from fleet import pki, roles as fleet_roles  # noqa: E402

DEFAULT_PORTS = {"prometheus": 9090, "alertmanager": 9093, "node": 9100, "blockstack": 9363,
                 "ebpf": 9435, "receiver": 9466, "grafana": 3000}
VENV_BIN = os.path.join(REPO, ".venv", "bin")
GRAFANA_HINT = grafana_runtime.HINT + "; everything else runs, and `make up` picks Grafana up next time."


def state_dir(args):
    return os.path.abspath(args.state or os.environ.get("STATE_DIR") or os.path.join(REPO, ".state"))


def write_private(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def write_if_changed(path, text, private=False):
    """Write text to path unless it is already there; True if the file changed."""
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except FileNotFoundError:
        pass
    if private:
        write_private(path, text)
    else:
        with open(path, "w") as f:
            f.write(text)
    return True


def secret(state, name):
    """A generated password kept 0600 in the state directory; the same one on every run."""
    path = os.path.join(state, "secrets", name)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_private(path, secrets.token_urlsafe(18) + "\n")
    with open(path) as f:
        return f.read().strip()


def grafana_binary():
    """(binary, homepath): GRAFANA_HOME, else grafana/grafana-server on PATH, else the tarball in
    ../shared/grafana unpacked once into .build/ (lab/blockstack_lab/grafana.py); None if none."""
    return grafana_runtime.find()


ROLE_PORTS = {"agent": fleet_roles.AGENT_PORTS, "central": {**fleet_roles.CENTRAL_PORTS, "grafana": 3000}}


class Deployment:
    def __init__(self, state, ports=None, listen="127.0.0.1", role="standalone", fleet=None, auth=False, tls=None):
        """role: standalone (the single-host stack), agent or central (fleet/roles.py); fleet: the
        role's options (host, replicas, alertmanagers, secrets, inventory, cluster_peers)."""
        self.state = state
        self.listen = listen
        self.role = role
        # standalone: basic auth + TLS on Prometheus, Alertmanager and Grafana (user admin); None on loopback
        self.web = None
        self.grafana_changed = False  # render(): Grafana's ini or provisioning changed (restart it)
        if role == "standalone" and (auth or not fleet_roles.loopback(listen)):
            self.web = fleet_roles.Secrets(os.path.join(state, "secrets"), user="admin")
        # the operator's (cert, key, ca) instead of the generated ones, copied into STATE/secrets
        self.tls = tls
        self.cert_name = "operator" if tls else "server"
        self.ca = (os.path.join(state, "secrets", "operator-ca.crt") if tls else self.web.ca) if self.web else None
        saved = self._load_ports()
        self.ports = {**(ROLE_PORTS.get(role) or DEFAULT_PORTS), **saved, **(ports or {})}
        self.grafana = grafana_binary() if role != "agent" else None
        components = list(COMPONENTS)
        self.fleet = None
        if role == "standalone":
            self.stack = Stack(os.path.join(state, "config"), components=components,
                               ports={c: self.ports[c] for c in components},
                               ebpf_configs=self._ebpf_configs(), data_dir=os.path.join(state, "data"))
            if self.web:
                self.stack.web_client = self.web.client_http(tls=True)
                self.stack.web_client["tls_config"]["ca_file"] = self.ca
                if self.listen not in ("0.0.0.0", "::"):  # one address: the stack's own clients go there too
                    self.stack.web_address = self.listen
            self.datasource_url = self.stack.url("prometheus")
        else:
            self.fleet = self._fleet_role(fleet or {})
            self.stack = self.fleet.exporters if role == "agent" else self.fleet.receiver_stack
            self.datasource_url = self.fleet.query_url() if role == "central" else None

    def _fleet_role(self, opts):
        config, data = os.path.join(self.state, "config"), os.path.join(self.state, "data")
        secrets = fleet_roles.Secrets(opts.get("secrets") or os.path.join(self.state, "secrets", "fleet"))
        if self.role == "agent":
            if not opts.get("alertmanagers"):
                raise SystemExit("--role agent needs --alertmanager ADDR:PORT for every central Alertmanager peer")
            host = opts.get("host") or os.uname().nodename
            if not fleet_roles.loopback(self.listen):
                crt, key = secrets.cert(host)
                for f in (crt, key, secrets.ca, secrets.password_file):
                    if not os.path.exists(f):
                        raise SystemExit(f"{f} missing: on the central side run `stackctl.py fleet-cert --host {host} "
                                         f"--address {self.listen}` and copy its output files here (docs/fleet.md)")
            return fleet_roles.Agent(config, host, opts["alertmanagers"], secrets, replicas=opts.get("replicas") or ("A",),
                                     listen=self.listen, data_dir=data, ports=self.ports,
                                     ebpf_configs=self._ebpf_configs())
        secrets.ensure(server_names={"central": [self.listen, "127.0.0.1"]}, client_names=["query"])
        return fleet_roles.Central(config, opts.get("inventory") or os.path.join(self.state, "inventory.yml"), secrets,
                                   listen=self.listen, data_dir=data, ports=self.ports,
                                   cluster_peers=opts.get("cluster_peers") or ())

    # -- state ------------------------------------------------------------------------

    def _load_ports(self):
        try:
            with open(os.path.join(self.state, "ports.json")) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def _ebpf_configs(self):
        """The ebpf_exporter configs this kernel loads, probed once per kernel and build."""
        from blockstack_lab import stack as stackmod
        cache = os.path.join(self.state, "ebpf-configs.txt")
        key = f"{os.uname().release} {_mtime(stackmod.EBPF_CONFIG_DIR)}"
        try:
            with open(cache) as f:
                cached_key, names = f.read().split("\n")[:2]
            if cached_key == key and names:
                return names
        except (FileNotFoundError, ValueError):
            pass
        names = stackmod.ebpf_config_names()
        os.makedirs(self.state, exist_ok=True)
        with open(cache, "w") as f:
            f.write(f"{key}\n{names}\n")
        return names

    @property
    def sock(self):
        return os.path.join(self.state, "supervisor.sock")

    @property
    def conf(self):
        return os.path.join(self.state, "supervisord.conf")

    # -- rendering --------------------------------------------------------------------

    def programs(self):
        """{name: (argv, env, health_url)} for supervisord."""
        if self.fleet is not None:
            cmds = self.fleet.commands()
            if self.grafana:
                cmds["grafana"] = self._grafana_command()
            return cmds
        cmds = self.stack.commands()
        if self.web:
            web_config = os.path.join(self.stack.workdir, "web-config.yml")
            for name in ("prometheus", "alertmanager"):
                argv = cmds[name][0]
                argv[:] = [a.replace("--web.listen-address=127.0.0.1:", f"--web.listen-address={self.listen}:") for a in argv]
                argv.append(f"--web.config.file={web_config}")
        if self.grafana:
            cmds["grafana"] = self._grafana_command()
        return cmds

    def _grafana_command(self):
        binary, home = self.grafana
        return grafana_runtime.command(binary, home, os.path.join(self.stack.workdir, "grafana.ini"), self.ports["grafana"],
                                       scheme="https" if self.web else "http",
                                       host=self.stack.address("grafana") if self.fleet is None else "127.0.0.1")

    def render(self):
        """Write every configuration file; True if supervisord's own configuration changed."""
        os.makedirs(os.path.join(self.state, "logs"), exist_ok=True)
        os.makedirs(os.path.join(self.state, "data"), exist_ok=True)
        if self.web:  # before the stack: prometheus.yml names the password file and the CA
            self._render_web_auth()
        (self.fleet or self.stack).render()
        write_if_changed(os.path.join(self.state, "ports.json"), json.dumps(self.ports, indent=1, sort_keys=True) + "\n")
        if self.grafana:
            before = self._grafana_files()
            self._render_grafana()
            # Grafana reads grafana.ini and its provisioning only at start (e.g. --auth's https)
            self.grafana_changed = self._grafana_files() != before
        return write_if_changed(self.conf, self.supervisord_conf(), private=True)

    def _render_web_auth(self):
        """STATE/secrets: the admin password, its bcrypt (fleet_roles.BCRYPT_COST), a CA and the
        listeners' certificate (for 127.0.0.1, localhost, this host's name and --listen); the
        exporter-toolkit web config of Prometheus and Alertmanager (the fleet's renderer)."""
        if self.tls:  # the operator's: it must name --listen ADDR (127.0.0.1 for 0.0.0.0/--auth): the stack's clients go there
            self.web.password()
            crt, key = self.web.cert(self.cert_name)
            for src, dst in zip(self.tls, (crt, key, self.ca)):
                with open(src) as f:
                    write_if_changed(dst, f.read(), private=True)
        else:
            names = ["127.0.0.1", "localhost", socket.gethostname()] + ([self.listen] if self.listen not in ("0.0.0.0", "::") else [])
            crt, key = self.web.cert("server")
            if self.listen not in ("0.0.0.0", "::") and os.path.exists(crt) and \
                    not {f"IP Address:{self.listen}", f"DNS:{self.listen}"} & pki.cert_names(crt):  # for another --listen
                os.unlink(crt)
            self.web.ensure(server_names={"server": list(dict.fromkeys(names))})
        os.makedirs(self.stack.workdir, exist_ok=True)
        self.web.web_config(os.path.join(self.stack.workdir, "web-config.yml"), cert_name=self.cert_name)

    def _grafana_files(self):
        texts = []
        for root, _, files in os.walk(self.stack.workdir):
            for f in sorted(files):
                if f == "grafana.ini" or "grafana-provisioning" in root:
                    with open(os.path.join(root, f)) as fh:
                        texts.append((root, f, fh.read()))
        return sorted(texts)

    def _render_grafana(self):
        """grafana.ini and provisioning in the config directory, Grafana's database in STATE/grafana."""
        secret(self.state, "grafana-admin-password")
        auth = {}
        if self.web:
            auth = {"tls": self.web.cert(self.cert_name), "datasource_auth": (self.web.user, self.web.password_file, self.ca)}
        grafana_runtime.render(self.stack.workdir, self.ports["grafana"], os.path.join(self.state, "grafana", "data"),
                               self.datasource_url, os.path.join(self.state, "secrets", "grafana-admin-password"),
                               listen=self.listen, **auth)

    def supervisord_conf(self):
        s, logs = self.state, os.path.join(self.state, "logs")
        lines = [
            "; rendered by deploy/stackctl.py: edit the source, not this file",
            "[unix_http_server]", f"file={self.sock}", "chmod=0700", "",
            "[supervisord]", f"logfile={logs}/supervisord.log", f"pidfile={s}/supervisord.pid",
            f"childlogdir={logs}", "logfile_maxbytes=10MB", "logfile_backups=3", "",
            "[rpcinterface:supervisor]", "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface", "",
            "[supervisorctl]", f"serverurl=unix://{self.sock}", "",
        ]
        for name, (argv, env, _) in self.programs().items():
            command = " ".join(shlex.quote(a) for a in argv).replace("%", "%%")
            lines += [f"[program:{name}]", f"command={command}", f"directory={s}",
                      "autostart=true", "autorestart=true", "startsecs=1", "startretries=100",
                      "stopasgroup=true", "killasgroup=true", "stopwaitsecs=20",
                      f"stdout_logfile={logs}/{name}.log", "redirect_stderr=true",
                      "stdout_logfile_maxbytes=10MB", "stdout_logfile_backups=3"]
            if env:
                lines.append("environment=" + ",".join(f'{k}="{v}"' for k, v in env.items()))
            lines.append("")
        return "\n".join(lines)

    # -- control ----------------------------------------------------------------------

    def supervisord_pid(self):
        try:
            with open(os.path.join(self.state, "supervisord.pid")) as f:
                pid = int(f.read().strip())
            os.kill(pid, 0)
            return pid
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None

    def ctl(self, *args, check=True):
        return subprocess.run([os.path.join(VENV_BIN, "supervisorctl"), "-c", self.conf, *args],
                              capture_output=True, text=True, timeout=120, check=check)

    def up(self, timeout=120):
        start = time.monotonic()
        running = self.supervisord_pid() is not None
        conf_changed = self.render()
        if self.supervisord_pid() is None:
            subprocess.run([os.path.join(VENV_BIN, "supervisord"), "-c", self.conf], check=True, timeout=60)
            self._wait_sock()
        elif conf_changed:
            self.ctl("reread")
            self.ctl("update")  # restarts only the programs whose command changed
        else:
            self.ctl("start", "all", check=False)  # anything stopped by hand comes back; else a no-op
        if running and self.grafana_changed:
            self.ctl("restart", "grafana")
        self.wait_healthy(timeout)
        self._reload_prometheus()  # rule and target edits apply without a restart; a no-op otherwise
        self.print_urls(time.monotonic() - start)

    def _reload_prometheus(self):
        import urllib.request
        if self.role == "agent":
            urls = [self.fleet.url(f"prometheus-{r}", "/-/reload") for r in self.fleet.replicas]
        elif self.role == "central":
            urls = [f"http://127.0.0.1:{self.fleet.ports[f'watcher-{r}']}/-/reload" for r in self.fleet.watchers]
        else:
            # SIGHUP through supervisord: no --web.enable-lifecycle (a local user could POST /-/quit)
            self.ctl("signal", "HUP", "prometheus")
            return
        for url in urls:
            with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10):
                pass

    def _wait_sock(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.sock) and self.ctl("pid", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise TimeoutError("supervisord did not come up; see " + os.path.join(self.state, "logs", "supervisord.log"))

    def wait_healthy(self, timeout=120):
        deadline = time.monotonic() + timeout
        for name, (_, _, url) in self.programs().items():
            while True:
                # probe: a 2xx, or 401 from a listener with basic auth on (it is up)
                if fleet_roles.probe(url, ca=self.ca if self.web else None):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} did not answer {url}; see {self.state}/logs/{name}.log")
                time.sleep(0.2)

    def print_urls(self, elapsed):
        host = "127.0.0.1" if self.listen in ("127.0.0.1", "0.0.0.0") else self.listen
        if self.fleet is not None:
            print(f"Block Stack Merges {self.role} role is up ({elapsed:.1f} s), state in {self.state}")
            for name, (_, _, url) in self.programs().items():
                print(f"  {name:<22} {url}")
            if self.role == "central":
                print(f"  pages file             {self.fleet.pages_file}")
                print(f"  inventory              {self.fleet.inventory}  (add hosts here; no restart)")
                print(f"  Grafana datasource     {self.datasource_url}  (Thanos Query, replica label `replica`)")
                if not self.grafana:
                    print(GRAFANA_HINT)
            if not fleet_roles.loopback(self.listen):
                print(f"  TLS + basic auth: user fleet, password in {self.fleet.secrets.password_file}")
            return
        print(f"Block Stack Merges is up ({elapsed:.1f} s), state in {self.state}, servers: {servers_name()}")
        scheme = "https" if self.web else "http"
        print(f"  Prometheus     {scheme}://{host}:{self.ports['prometheus']}/   (alerts: /alerts)")
        print(f"  Alertmanager   {scheme}://{host}:{self.ports['alertmanager']}/")
        print(f"  pages file     {self.stack.pages_file}")
        for name, label in (("node", "node_exporter"), ("blockstack", "blockstack-exporter"), ("ebpf", "ebpf_exporter"),
                            ("receiver", "page receiver")):
            print(f"  {label:<14} http://127.0.0.1:{self.ports[name]}/metrics" if name != "receiver"
                  else f"  {label:<14} http://127.0.0.1:{self.ports[name]}/")
        if self.grafana:
            print(f"  Grafana        {scheme}://{host}:{self.ports['grafana']}/d/blockstack-merges  "
                  f"(admin, password in {self.state}/secrets/grafana-admin-password)")
        else:
            print(GRAFANA_HINT)
        if self.web:
            print(f"  TLS + basic auth: admin / password in {self.web.password_file}, CA {self.ca}")

    def down(self):
        pid = self.supervisord_pid()
        if pid is None:
            print("not running")
            return
        self.ctl("stop", "all", check=False)
        os.kill(pid, signal.SIGTERM)
        for _ in range(300):
            if self.supervisord_pid() is None:
                break
            time.sleep(0.1)
        print(f"stopped; data kept in {self.state}/data")


def _mtime(path):
    try:
        return int(max(os.stat(os.path.join(path, f)).st_mtime for f in os.listdir(path)))
    except (FileNotFoundError, ValueError):
        return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["up", "down", "status", "logs", "clean", "render", "fleet-cert"])
    p.add_argument("name", nargs="?", help="component, for logs")
    p.add_argument("--state", help="state directory (default $STATE_DIR or .state in the repository)")
    p.add_argument("--port", action="append", default=[], metavar="NAME=PORT", help=f"override a port ({', '.join(DEFAULT_PORTS)})")
    p.add_argument("--listen", default="127.0.0.1",
                   help="address for Prometheus, Alertmanager and Grafana; anything but loopback turns on TLS + basic auth")
    p.add_argument("--auth", action="store_true",
                   help="TLS + basic auth on Prometheus, Alertmanager and Grafana also on loopback (README \"Security\")")
    p.add_argument("--tls-cert", help="with --listen/--auth: your server certificate (PEM; naming the --listen address, 127.0.0.1 for 0.0.0.0) "
                                      "instead of one from a CA generated in STATE/secrets")
    p.add_argument("--tls-key", help="its private key")
    p.add_argument("--tls-ca", help="the CA certificate that signed it (default: the certificate itself)")
    p.add_argument("--servers", choices=list(SERVERS), default=os.environ.get("BLOCKSTACK_SERVERS") or DEFAULT_SERVERS,
                   help="Prometheus and Alertmanager: debian (Debian's packages, Prometheus 2) or upstream "
                        "(Prometheus 3, built by make upstream-servers); default $BLOCKSTACK_SERVERS or %(default)s")
    fleet = p.add_argument_group("fleet roles (docs/fleet.md)")
    fleet.add_argument("--role", choices=["standalone", "agent", "central"], default="standalone")
    fleet.add_argument("--host", help="agent: this host's name (the `host` label; default the hostname); fleet-cert: whose")
    fleet.add_argument("--address", help="fleet-cert: the address the host's sidecar listens on")
    fleet.add_argument("--replica", action="append", default=[], help="agent: a Prometheus replica name (A, B); repeat for two")
    fleet.add_argument("--alertmanager", action="append", default=[], metavar="ADDR:PORT",
                       help="agent: a central Alertmanager peer; repeat for every peer")
    fleet.add_argument("--fleet-secrets", help="CA, certificates and the fleet password (default STATE/secrets/fleet)")
    fleet.add_argument("--inventory", help="central: the file_sd inventory of agent sidecars (default STATE/inventory.yml)")
    fleet.add_argument("--cluster-peer", action="append", default=[], metavar="ADDR:PORT",
                       help="central: an Alertmanager peer on another central machine (its cluster port)")
    args = p.parse_args(argv)
    os.environ["BLOCKSTACK_SERVERS"] = args.servers  # read by every Stack and fleet role of this run
    ports = {}
    known = ROLE_PORTS.get(args.role) or DEFAULT_PORTS
    for item in args.port:
        name, _, port = item.partition("=")
        if name not in known or not port.isdigit():
            p.error(f"--port {item}: expected NAME=PORT with NAME in {', '.join(known)}")
        ports[name] = int(port)
    state = state_dir(args)
    if args.command == "fleet-cert":
        if not (args.host and args.address):
            p.error("fleet-cert needs --host and --address")
        secrets = fleet_roles.Secrets(args.fleet_secrets or os.path.join(state, "secrets", "fleet")).ensure(
            server_names={args.host: [args.address]})
        crt, key = secrets.cert(args.host)
        print(f"copy to {args.host}'s fleet secrets directory (0700): {secrets.ca} {crt} {key} {secrets.password_file}")
        return
    if args.command == "clean":
        pid_file = os.path.join(state, "supervisord.pid")
        if os.path.exists(pid_file):
            Deployment(state).down()
        shutil.rmtree(state, ignore_errors=True)
        print(f"removed {state}")
        return
    if args.command in ("status", "logs", "down") and not os.path.exists(os.path.join(state, "supervisord.conf")):
        print(f"not set up in {state} (make up)")
        return
    fleet_opts = {"host": args.host, "replicas": args.replica, "alertmanagers": args.alertmanager,
                  "secrets": args.fleet_secrets, "inventory": args.inventory, "cluster_peers": args.cluster_peer}
    role_file = os.path.join(state, "role.json")
    if args.command == "up" and args.role != "standalone":
        os.makedirs(state, exist_ok=True)
        write_if_changed(role_file, json.dumps({"role": args.role, "listen": args.listen, "fleet": fleet_opts}, indent=1) + "\n")
    elif args.role == "standalone" and os.path.exists(role_file):
        # down/status/logs/render of a role deployment: the options it was brought up with
        with open(role_file) as f:
            saved = json.load(f)
        args.role, args.listen, fleet_opts = saved["role"], saved["listen"], saved["fleet"]
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    tls = (args.tls_cert, args.tls_key, args.tls_ca or args.tls_cert) if args.tls_cert else None
    if tls and fleet_roles.loopback(args.listen) and not args.auth:
        p.error("--tls-cert is for --listen ADDR or --auth (nothing serves TLS on the loopback default)")
    d = Deployment(state, ports, args.listen, role=args.role, fleet=fleet_opts, auth=args.auth, tls=tls)
    if args.command == "up":
        d.up()
    elif args.command == "render":
        d.render()
        print(f"rendered into {state}")
    elif args.command == "down":
        d.down()
    elif args.command == "status":
        if d.supervisord_pid() is None:
            print("not running (make up)")
            sys.exit(3)
        r = d.ctl("status", check=False)
        print(r.stdout, end="")
        sys.exit(0 if r.returncode == 0 else 3)
    elif args.command == "logs":
        logs = os.path.join(state, "logs")
        names = [args.name] if args.name else sorted(f[:-4] for f in os.listdir(logs) if f.endswith(".log"))
        for n in names:
            print(f"==> {logs}/{n}.log <==")
            subprocess.run(["tail", "-n", "20", os.path.join(logs, f"{n}.log")])


if __name__ == "__main__":
    main()
