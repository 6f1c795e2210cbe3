"""The three ways to run the stack on a host, behind one interface (Role).

standalone (`make up`)
    the single-host stack of stack.py, Grafana, all on 127.0.0.1; `--listen ADDR` or `--auth`
    put Prometheus, Alertmanager and Grafana behind TLS + basic auth (user admin, pki.Secrets).
agent (`make up-agent`, on every monitored host)
    node_exporter, blockstack-exporter, ebpf_exporter on 127.0.0.1 (stack.py; node_exporter and
    ebpf_exporter behind metrics_front.py, as in standalone); one Prometheus per replica (A, B, ...)
    on 127.0.0.1 behind a local admin password that scrapes them, evaluates alerts/{alerts,recording}.rules.yml next to
    the data and sends alerts to every central alert gate with the host's own push secret;
    `external_labels: {host, replica}`; `replica` is dropped from alerts (alert_relabel_configs)
    so both replicas' alerts are the same alert to Alertmanager; one Thanos sidecar per replica:
    StoreAPI (gRPC, mutual TLS) and /metrics (HTTP, the central's scrape user; TLS beyond
    loopback) on the host's fleet address, reading its Prometheus with the local password.
central (`make up-central`)
    the page receiver (127.0.0.1); an Alertmanager cluster of `peers` peers (gossip on 127.0.0.1,
    or --cluster.peer to peers on other machines), web on 127.0.0.1 behind the admin password,
    each behind an alert gate (alert_gate.py) on the fleet address that takes only hosts' pushes;
    Thanos Query on 127.0.0.1 behind the admin password (Grafana's datasource) with
    --query.replica-label=replica, its StoreAPI endpoints read from the inventory file
    (--store.sd-files, re-read on change); a "watcher" Prometheus (admin password too) that
    scrapes every sidecar in the same inventory (file_sd) and raises
    BlockStackHostDown (alerts/fleet.rules.yml) to the Alertmanager cluster; Grafana.

Inventory (file_sd style, one entry per agent Prometheus replica; the file can grow without a
restart: both Thanos Query and the watcher re-read it):

    - targets: ["10.0.0.11:10901"]                   # the sidecar's gRPC StoreAPI
      labels: {host: db1, replica: A, __http_address__: "10.0.0.11:10902"}   # its HTTP /metrics
"""

import base64
import os
import shutil
import socket
import ssl
import urllib.error
import urllib.request

import yaml

from blockstack_exporter.collectors.ebpf import parse_status
from blockstack_rules import knobs

from . import alert_gate, fleet_auth, grafana, pki, privileges
from .files import secret, write_if_changed, write_yaml
from .stack import (
    BUILD,
    COMPONENTS,
    CORS_ORIGIN,
    RETENTION,
    RETENTION_SIZE,
    Stack,
    program,
    servers_name,
    which,
)

THANOS = os.path.join(BUILD, "bin", "thanos")
GRAFANA_HINT = grafana.HINT + "; everything else runs, and `make up` picks Grafana up next time."
SOURCE = "blockstack_deploy/roles.py"


def thanos():
    return which(THANOS, target="thanos")


def loopback(addr):
    return addr in ("127.0.0.1", "localhost", "::1")


def probe(url, auth=None, ca=None, timeout=2):
    """True when something answers HTTP at url: 2xx, or 401 when no credentials were given
    (basic auth on: the server is up). https is verified against `ca` when given."""
    ctx = None
    if url.startswith("https:"):
        ctx = ssl.create_default_context(cafile=ca) if ca else ssl._create_unverified_context()
    req = urllib.request.Request(url)
    if auth:
        req.add_header(
            "Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        )
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            r.read()
        return True
    except urllib.error.HTTPError as e:
        return e.code == 401 and not auth
    except OSError:
        return False


def self_pages_dir(state):
    """The second notifier's directory, off the state's disk: /run (tmpfs) as root, one directory
    per state directory; inside the state without root."""
    if os.geteuid() != 0:
        return os.path.join(state, "run", "self-pages")
    return os.path.join("/run", "blockstack-merges", state.strip("/").replace("/", "-"))


class Role:
    """One way to run the stack on a host, on a state directory (configuration in STATE/config,
    data in STATE/data). Every role has:
        render()          writes its configuration; returns the programs to restart because a
                          file they read only at start changed
        commands()        {program: (argv, env, health_url)} in start order
        reloads           the programs that re-read their configuration on SIGHUP
        summary(elapsed)  the lines `make up` prints
        ca                the CA that verifies its own https health URLs (None: unverified)
    supervisor.py runs the commands under supervisord, systemd.py renders them as units."""

    name = None
    PORTS = {}
    reloads = ()
    ca = None
    owned = ()  # (program, directory) it writes besides its --storage path (privileges.apply)
    sockets = ()  # (program, directory) of its socket: only the front (the dm helper's: the exporter) may enter

    def __init__(self, state, ports=None, listen="127.0.0.1", grafana_server=None):
        """grafana_server: (binary, home) of the Grafana that runs with the role (grafana.find())."""
        self.state = os.path.abspath(state)
        self.config, self.data = (
            os.path.join(self.state, "config"),
            os.path.join(self.state, "data"),
        )
        self.ports = {**self.PORTS, **(ports or {})}
        self.listen, self.grafana = listen, grafana_server

    def _front_exporters(self, stack):
        """node_exporter and ebpf_exporter of `stack` on Unix sockets in STATE/run/{node,ebpf},
        their ports answered by metrics_front.py with /metrics only: Go's /debug/pprof/ has no
        off switch and ebpf_exporter no web config (basic auth)."""
        stack.metrics_socket_dir = os.path.join(self.state, "run")
        self.sockets = [
            (c, os.path.dirname(stack.metrics_socket(c)))
            for c in ("node", "ebpf")
            if c in stack.components
        ]
        if (
            "blockstack" in stack.components and privileges.device_mapper()
        ):  # else nothing holds CAP_SYS_ADMIN
            stack.dm_helper_socket = os.path.join(self.state, "run", "dm", "helper.sock")
            self.sockets.append(("dm", os.path.dirname(stack.dm_helper_socket)))

    def _make_socket_dirs(self):
        for _, directory in self.sockets:
            os.makedirs(directory, mode=0o700, exist_ok=True)

    def _grafana_command(self, scheme="http", host="127.0.0.1"):
        binary, home = self.grafana
        return grafana.command(
            binary,
            home,
            os.path.join(self.config, "grafana.ini"),
            self.ports["grafana"],
            scheme=scheme,
            host=host,
        )

    def _render_grafana(self, datasource_url, **auth):
        """grafana.ini and provisioning in STATE/config, Grafana's database in STATE/grafana."""
        if not self.grafana:
            return []
        changed = grafana.render(
            self.config,
            self.ports["grafana"],
            os.path.join(self.state, "grafana", "data"),
            datasource_url,
            os.path.join(self.state, "secrets", "grafana-admin-password"),
            listen=self.listen,
            **auth,
        )
        return ["grafana"] if changed else []


class Standalone(Role):
    """The single-host stack (stack.Stack) and Grafana; TLS + basic auth beyond loopback or with auth."""

    name = "standalone"
    PORTS = {
        "prometheus": 9090,
        "alertmanager": 9093,
        "node": 9100,
        "blockstack": 9363,
        "ebpf": 9435,
        "receiver": 9466,
        "receiver-self": 9467,
        "grafana": 3000,
    }
    reloads = ("prometheus",)  # no --web.enable-lifecycle: any local user could POST /-/quit

    def __init__(
        self,
        state,
        ports=None,
        listen="127.0.0.1",
        auth=False,
        tls=None,
        grafana_server=None,
        ebpf_configs=None,
    ):
        """tls: the operator's (cert, key, ca) instead of the generated ones, copied into STATE/secrets."""
        super().__init__(state, ports, listen, grafana_server)
        self.web = None  # basic auth + TLS on Prometheus, Alertmanager and Grafana (user admin)
        self.admin = pki.Secrets(os.path.join(self.state, "secrets"), user="admin")
        if auth or not loopback(listen):
            self.web = self.admin
        self.tls = tls
        self.cert_name = "operator" if tls else "server"
        self.stack = Stack(
            self.config,
            components=COMPONENTS,
            ports={c: self.ports[c] for c in COMPONENTS},
            ebpf_configs=ebpf_configs,
            ebpf_cache=os.path.join(self.state, "ebpf-configs.txt"),
            data_dir=self.data,
        )
        self.stack.receiver_token_file = os.path.join(self.state, "secrets", "receiver-token")
        self.stack.pages_file = os.path.join(self.state, "pages", "pages.jsonl")
        run = self_pages_dir(self.state)
        self.stack.self_pages_file = os.path.join(run, "pages.jsonl")
        self.stack.heartbeat_url_file = os.path.join(
            self.state, "secrets", "heartbeat-url"
        )  # when the operator made it
        self.owned = [
            ("receiver", os.path.dirname(self.stack.pages_file)),
            ("receiver-self", run),
            ("grafana", os.path.join(self.state, "grafana")),
        ]
        # Prometheus takes the admin password, Alertmanager its own (self.silencer), in every mode (plain HTTP on loopback
        # by default); the exporters with a /debug/pprof/ answer /metrics only (metrics_front.py)
        self.stack.loopback_web_config = os.path.join(self.config, "loopback-web.yml")
        self.stack.loopback_client = self.admin.client_http(tls=False)
        self._front_exporters(self.stack)
        if self.web:
            self.ca = os.path.join(self.state, "secrets", "operator-ca.crt") if tls else self.web.ca
            self.stack.web_client = self.web.client_http(tls=True)
            self.stack.web_client["tls_config"]["ca_file"] = self.ca
            self.stack.web_listen = listen
            self.stack.web_config_file = os.path.join(self.config, "web-config.yml")
            if listen not in ("0.0.0.0", "::"):  # one address: the stack's own clients go there too
                self.stack.web_address = listen
        # Alertmanager's own user and password: a reader of Prometheus (Grafana's datasource) cannot silence a page
        self.silencer = pki.Secrets(os.path.join(self.state, "secrets"), user="alertmanager")
        client = self.silencer.client_http(tls=bool(self.web))
        if self.web:
            client["tls_config"]["ca_file"] = self.ca
        self.stack.alertmanager_auth = (os.path.join(self.config, "alertmanager-web.yml"), client)

    def render(self):
        self._make_socket_dirs()
        if self.web:  # before the stack: prometheus.yml names the password file and the CA
            self._render_web_auth()
        else:
            os.makedirs(self.config, exist_ok=True)
            self.admin.web_config(self.stack.loopback_web_config, cert_name=None)
        self.silencer.web_config(
            self.stack.alertmanager_auth[0], cert_name=self.cert_name if self.web else None
        )
        if self.grafana:  # Prometheus scrapes Grafana's /metrics too (BlockStackGrafanaDown)
            self.stack.also_scrape["grafana"] = (
                f"{self.stack.address('grafana')}:{self.ports['grafana']}",
                "https" if self.web else "http",
            )
        self.stack.render()
        auth = {
            "datasource_auth": (self.admin.user, self.admin.password_file, None)
        }  # Prometheus's basic auth
        if self.web:
            auth = {
                "tls": self.web.cert(self.cert_name),
                "datasource_auth": (self.web.user, self.web.password_file, self.ca),
            }
        return self._render_grafana(self.stack.url("prometheus"), **auth)

    def _render_web_auth(self):
        """STATE/secrets: the admin password, its bcrypt, a CA and the listeners' certificate (for
        127.0.0.1, localhost, this host's name and --listen) or the operator's; the web config of
        Prometheus and Alertmanager."""
        if self.tls:  # the operator's: it must name --listen ADDR (127.0.0.1 for 0.0.0.0/--auth): the stack's clients go there
            self.web.password()
            crt, key = self.web.cert(self.cert_name)
            for src, dst in zip(self.tls, (crt, key, self.ca)):
                with open(src) as f:
                    write_if_changed(dst, f.read(), private=True)
        else:
            one = self.listen not in ("0.0.0.0", "::")
            names = ["127.0.0.1", "localhost", socket.gethostname()] + (
                [self.listen] if one else []
            )
            crt, _ = self.web.cert("server")
            if (
                one
                and os.path.exists(crt)
                and not {f"IP Address:{self.listen}", f"DNS:{self.listen}"} & pki.cert_names(crt)
            ):  # for another --listen
                os.unlink(crt)
            self.web.ensure(server_names={"server": list(dict.fromkeys(names))}, single_use=True)
        os.makedirs(self.config, exist_ok=True)
        self.web.web_config(self.stack.web_config_file, cert_name=self.cert_name)

    def commands(self):
        cmds = self.stack.commands()
        if self.grafana:
            cmds["grafana"] = self._grafana_command(
                "https" if self.web else "http", self.stack.address("grafana")
            )
        return cmds

    def summary(self, elapsed):
        host = "127.0.0.1" if self.listen in ("127.0.0.1", "0.0.0.0") else self.listen
        scheme = "https" if self.web else "http"
        p = self.ports
        lines = [
            f"Block Stack Merges is up ({elapsed:.1f} s), state in {self.state}, servers: {servers_name()}",
            f"  Prometheus     {scheme}://{host}:{p['prometheus']}/   (alerts: /alerts; admin, password in {self.admin.password_file})",
            f"  Alertmanager   {scheme}://{host}:{p['alertmanager']}/   (alertmanager, password in {self.silencer.password_file})",
            f"  pages file     {self.stack.pages_file}",
            f"  pager's own    {self.stack.self_pages_file}   (the second notifier: the pager's own failures)",
        ]
        for name, label in (
            ("node", "node_exporter"),
            ("blockstack", "blockstack-exporter"),
            ("ebpf", "ebpf_exporter"),
        ):
            if name != "ebpf" or self.stack.runs_ebpf:
                lines.append(f"  {label:<14} http://127.0.0.1:{p[name]}/metrics")
        lines += ebpf_summary(self.stack)
        lines.append(f"  {'page receiver':<14} http://127.0.0.1:{p['receiver']}/")
        if self.grafana:
            lines.append(
                f"  Grafana        {scheme}://{host}:{p['grafana']}/d/blockstack-merges  "
                f"(admin, password in {self.state}/secrets/grafana-admin-password)"
            )
        else:
            lines.append(GRAFANA_HINT)
        if self.web:
            lines.append(
                f"  TLS + basic auth: admin / password in {self.web.password_file} (alertmanager / "
                f"{self.silencer.password_file} on Alertmanager), CA {self.ca}"
            )
        return lines


def ebpf_summary(stack):
    """Lines for make up's summary on the BPF program sets that did not load on this kernel: the
    collapse page rests on the block set, so a host without it must say so (so does the alert
    BlockStackCollapseEvidenceMissing, from blockstack-exporter's blockstack_ebpf_set_loaded)."""
    try:
        with open(stack.ebpf_status_file or "") as f:
            rows = parse_status(f.read())
    except (OSError, ValueError):
        return []
    lines = []
    for name, chosen, errors in rows:
        if not chosen:
            blind = " (the collapse page cannot fire on this host)" if name == "block" else ""
            failures = "; ".join(f"{variant}: {error}" for variant, error in errors.items())
            lines.append(
                f"  WARNING: no {name} BPF programs load on this kernel{blind}: {failures}"
            )
    if not stack.runs_ebpf:
        lines.append(
            f"  {'ebpf_exporter':<14} not started: nothing to load ({stack.ebpf_status_file})"
        )
    return lines


class FleetRole(Role):
    """What the agent and the central side share: the fleet's secrets (fleet_auth.py), its summary."""

    extra = ()  # lines the role adds to the summary

    def summary(self, elapsed):
        lines = [
            f"Block Stack Merges {self.name} role is up ({elapsed:.1f} s), state in {self.state}"
        ]
        lines += [f"  {name:<22} {url}" for name, (_, _, url) in self.commands().items()]
        lines += self.extra
        return lines

    @property
    def secure(self):
        return not loopback(self.listen)


class Agent(FleetRole):
    """One monitored host: exporters, `replicas` Prometheus with identical rules, a sidecar each."""

    name = "agent"
    # Per host: the sidecar ports are the ones the central inventory names.
    PORTS = {
        "node": 9100,
        "blockstack": 9363,
        "ebpf": 9435,
        "prometheus-A": 9090,
        "prometheus-B": 9091,
        "sidecar-A-grpc": 10901,
        "sidecar-A-http": 10902,
        "sidecar-B-grpc": 10911,
        "sidecar-B-http": 10912,
    }

    @property
    def extra(self):
        return ebpf_summary(self.exporters)

    def __init__(
        self,
        state,
        host,
        alertmanagers,
        secrets=None,
        replicas=("A",),
        listen="127.0.0.1",
        ports=None,
        devices=None,
        scrape_interval="5s",
        ebpf_configs=None,
    ):
        """alertmanagers: ["ADDR:PORT", ...] every central alert gate. secrets: this host's
        fleet_auth.HostSecrets (its push secret; its certificate and the scrape user's hash when
        listen is not loopback). devices: a regex
        of the block devices this host owns; only for simulated hosts sharing one kernel (the
        fleet test), real hosts own every device they see."""
        super().__init__(state, ports, listen)
        if secrets is None:
            raise ValueError(
                "an agent needs its fleet secrets (fleet_auth.HostSecrets: push secret, scrape hash)"
            )
        self.host, self.replicas = host, list(replicas)
        self.alertmanagers, self.secrets, self.devices = list(alertmanagers), secrets, devices
        self.reloads = tuple(f"prometheus-{r}" for r in self.replicas)
        exporters = ("node", "blockstack", "ebpf")
        self.exporters = Stack(
            self.config,
            host=host,
            components=exporters,
            scrape_interval=scrape_interval,
            evaluation_interval=scrape_interval,
            ebpf_configs=ebpf_configs,
            ebpf_cache=os.path.join(self.state, "ebpf-configs.txt"),
            ports={c: self.ports[c] for c in exporters},
            data_dir=self.data,
        )
        self._front_exporters(self.exporters)
        # The replicas' Prometheus (and its /debug/pprof/) behind a password of this host's own,
        # which only the sidecars send (prometheus-client.yml); it never leaves the host.
        self.admin = pki.Secrets(os.path.join(self.state, "secrets"), user="admin")

    def inventory_entries(self, address=None):
        """This agent's lines for the central inventory."""
        address = address or self.listen
        return [
            {
                "targets": [f"{address}:{self.ports[f'sidecar-{r}-grpc']}"],
                "labels": {
                    "host": self.host,
                    "replica": r,
                    "__http_address__": f"{address}:{self.ports[f'sidecar-{r}-http']}",
                },
            }
            for r in self.replicas
        ]

    def prometheus_config(self, replica):
        base = self.exporters.prometheus_config()
        scrape_configs = base["scrape_configs"]
        if self.devices:
            # Simulated hosts share one kernel: keep only this host's devices (and series that
            # have no device label at all).
            for sc in scrape_configs:
                sc["metric_relabel_configs"] = [
                    {"source_labels": ["device"], "regex": f"({self.devices})?", "action": "keep"}
                ]
        am = {"static_configs": [{"targets": self.alertmanagers}], "timeout": "10s"}
        if self.secrets:
            # The gates take this host's push secret, over TLS whenever they listen beyond loopback.
            central_secure = not all(loopback(a.rsplit(":", 1)[0]) for a in self.alertmanagers)
            am.update(self.secrets.push_client(tls=central_secure))
        return {
            "global": {
                **base["global"],
                "external_labels": {"host": self.host, "replica": replica},
            },
            "rule_files": base["rule_files"],
            "scrape_configs": scrape_configs,
            "alerting": {
                # Every replica sends the same alert; without `replica` they are one alert to
                # Alertmanager (same labels, same fingerprint) and page once.
                "alert_relabel_configs": [{"action": "labeldrop", "regex": "replica"}],
                "alertmanagers": [am],
            },
        }

    def render(self):
        os.makedirs(self.config, exist_ok=True)
        self._make_socket_dirs()
        for r in self.replicas:
            write_yaml(
                os.path.join(self.config, f"prometheus-{r}.yml"), self.prometheus_config(r), SOURCE
            )
        self.admin.web_config(os.path.join(self.config, "prometheus-web.yml"), cert_name=None)
        write_yaml(
            os.path.join(self.config, "prometheus-client.yml"),
            self.admin.client_http(tls=False),
            SOURCE,
            private=True,
        )
        self.secrets.sidecar_web_config(
            os.path.join(self.config, "web-config.yml"), tls=self.secure
        )
        return []

    def commands(self):
        cmds = self.exporters.commands()
        w, d = self.config, self.data
        for r in self.replicas:
            prom = self.ports[f"prometheus-{r}"]
            cmds[f"prometheus-{r}"] = (
                [
                    program("prometheus"),
                    f"--config.file={w}/prometheus-{r}.yml",
                    f"--storage.tsdb.path={d}/prometheus-{r}",
                    f"--storage.tsdb.retention.time={RETENTION}",
                    f"--storage.tsdb.retention.size={RETENTION_SIZE}",
                    # Thanos: fixed 2 h blocks, so a sidecar with an object store uploads every block.
                    "--storage.tsdb.min-block-duration=2h",
                    "--storage.tsdb.max-block-duration=2h",
                    # no --web.enable-lifecycle: POST /-/quit exits 0, which Restart=on-failure does
                    # not restart; reloads are SIGHUP (self.reloads)
                    f"--web.listen-address=127.0.0.1:{prom}",
                    f"--web.cors.origin={CORS_ORIGIN}",
                    f"--web.config.file={w}/prometheus-web.yml",
                ],
                {},
                f"http://127.0.0.1:{prom}/-/ready",
            )
            argv = [
                thanos(),
                "sidecar",
                f"--prometheus.url=http://127.0.0.1:{prom}",
                f"--prometheus.http-client-file={w}/prometheus-client.yml",
                f"--tsdb.path={d}/prometheus-{r}",
                f"--grpc-address={self.listen}:{self.ports[f'sidecar-{r}-grpc']}",
                f"--http-address={self.listen}:{self.ports[f'sidecar-{r}-http']}",
                f"--http.config={w}/web-config.yml",
                "--log.level=warn",
            ]
            scheme = "http"
            if self.secure:
                crt, key = self.secrets.cert(self.host)
                argv += [
                    f"--grpc-server-tls-cert={crt}",
                    f"--grpc-server-tls-key={key}",
                    f"--grpc-server-tls-client-ca={self.secrets.ca}",
                ]
                scheme = "https"
            cmds[f"sidecar-{r}"] = (
                argv,
                {},
                f"{scheme}://{self.listen}:{self.ports[f'sidecar-{r}-http']}/-/ready",
            )
        return cmds


class Central(FleetRole):
    """The central side: receiver, Alertmanager cluster (each peer behind an alert gate), Thanos
    Query, the watcher Prometheus, Grafana."""

    name = "central"
    # gate-N: what agents push to (the fleet address); alertmanager-N: the peer's web, 127.0.0.1
    PORTS = {
        "receiver": 9466,
        "query-http": 10904,
        "query-grpc": 10903,
        "watcher-A": 9089,
        "watcher-B": 9088,
        "gate-1": 9093,
        "alertmanager-1": 9193,
        "alertmanager-1-cluster": 9094,
        "gate-2": 9095,
        "alertmanager-2": 9195,
        "alertmanager-2-cluster": 9096,
        "grafana": 3000,
    }

    def __init__(
        self,
        state,
        inventory,
        secrets,
        listen="127.0.0.1",
        ports=None,
        peers=2,
        cluster_peers=(),
        watchers=("A",),
        scrape_interval="5s",
        host_down_for=None,
        grafana_server=None,
    ):
        """inventory: the file_sd file of every agent sidecar. secrets: fleet_auth.CentralSecrets.
        listen: the address agents reach the alert gates on (TLS when not loopback). cluster_peers: Alertmanager
        peers on other machines (ADDR:PORT of their cluster listener)."""
        super().__init__(state, ports, listen, grafana_server)
        self.inventory, self.secrets = os.path.abspath(inventory), secrets
        self.peers, self.cluster_peers, self.watchers = peers, list(cluster_peers), list(watchers)
        self.scrape_interval, self.host_down_for = scrape_interval, host_down_for
        self.reloads = tuple(f"watcher-{r}" for r in self.watchers)
        for i in range(1, peers + 1):
            self.ports.setdefault(f"gate-{i}", 9093 + 2 * (i - 1))
            self.ports.setdefault(f"alertmanager-{i}", 9193 + 2 * (i - 1))
            self.ports.setdefault(f"alertmanager-{i}-cluster", 9094 + 2 * (i - 1))
        for r in self.watchers:
            self.ports.setdefault(f"watcher-{r}", 9089 - (ord(r) - ord("A")))
        self.receiver_stack = Stack(
            self.config,
            components=("receiver", "alertmanager"),
            ports={
                "receiver": self.ports["receiver"],
                "alertmanager": self.ports["alertmanager-1"],
            },
        )
        self.receiver_stack.pages_file = os.path.join(self.state, "pages", "pages.jsonl")
        self.owned = [
            ("receiver", os.path.dirname(self.pages_file)),
            ("grafana", os.path.join(self.state, "grafana")),
        ]

    @property
    def pages_file(self):
        return self.receiver_stack.pages_file

    def alertmanager_addresses(self):
        """Where agents send alerts: the gate of every peer."""
        return [f"{self.listen}:{self.ports[f'gate-{i}']}" for i in range(1, self.peers + 1)]

    def query_url(self, path=""):
        return f"http://127.0.0.1:{self.ports['query-http']}{path}"

    def watcher_config(self, replica):
        agent_job = {
            "job_name": "fleet-agent",
            "scrape_interval": self.scrape_interval,
            "file_sd_configs": [{"files": [self.inventory], "refresh_interval": "1m"}],
            "relabel_configs": [
                {"source_labels": ["__http_address__"], "target_label": "__address__"}
            ],
            # `up` is what the watcher is for; of the sidecar's own few hundred series keep only
            # whether it reaches its Prometheus (a few series per replica at 1,000 hosts).
            "metric_relabel_configs": [
                {
                    "source_labels": ["__name__"],
                    "regex": "thanos_sidecar_prometheus_up",
                    "action": "keep",
                }
            ],
        }
        agent_job.update(self.secrets.scrape.client_http(tls=self.secure))
        am = {
            "static_configs": [
                {
                    "targets": [
                        f"127.0.0.1:{self.ports[f'alertmanager-{i}']}"
                        for i in range(1, self.peers + 1)
                    ]
                }
            ],
            "timeout": "10s",
            **self.secrets.client_http(tls=False),
        }
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
                "external_labels": {"watcher": replica},
            },
            "rule_files": [os.path.join(self.config, "fleet.rules.yml")],
            "scrape_configs": [agent_job],
            "alerting": {
                "alert_relabel_configs": [{"action": "labeldrop", "regex": "watcher"}],
                "alertmanagers": [am],
            },
        }

    def render(self):
        os.makedirs(self.config, exist_ok=True)
        if not os.path.exists(self.inventory):
            os.makedirs(os.path.dirname(self.inventory), exist_ok=True)
            with open(self.inventory, "w") as f:
                f.write(
                    "# Fleet inventory (file_sd): one entry per agent Prometheus replica's Thanos sidecar.\n"
                    "# Thanos Query and the watcher re-read this file on change; see docs/fleet.md.\n[]\n"
                )
        secret(self.receiver_stack.receiver_token_file)
        write_yaml(
            os.path.join(self.config, "alertmanager.yml"),
            self.receiver_stack.alertmanager_config(),
            SOURCE,
        )
        # the fleet test waits less for a host down than the knob says
        overrides = {"fleet_host_down_for": self.host_down_for} if self.host_down_for else {}
        write_if_changed(
            os.path.join(self.config, "fleet.rules.yml"),
            knobs.rule_files(knobs.load(), **overrides)[knobs.FLEET_RULES],
        )
        for r in self.watchers:
            write_yaml(
                os.path.join(self.config, f"watcher-{r}.yml"), self.watcher_config(r), SOURCE
            )
        # the Alertmanager peers, the watchers and Thanos Query (and their /debug/pprof/): the admin password
        self.secrets.web_config(os.path.join(self.config, "admin-web.yml"), cert_name=None)
        return self._render_grafana(
            self.query_url(), datasource_auth=(self.secrets.user, self.secrets.password_file, None)
        )

    def commands(self):
        w, d, p = self.config, self.data, self.ports
        cmds = {"receiver": self.receiver_stack.commands()["receiver"]}
        for i in range(1, self.peers + 1):
            argv = [
                program("alertmanager"),
                f"--config.file={w}/alertmanager.yml",
                f"--storage.path={d}/alertmanager-{i}",
                f"--web.listen-address=127.0.0.1:{p[f'alertmanager-{i}']}",
                f"--web.config.file={w}/admin-web.yml",
                f"--cluster.listen-address=127.0.0.1:{p[f'alertmanager-{i}-cluster']}",
                f"--cluster.advertise-address=127.0.0.1:{p[f'alertmanager-{i}-cluster']}",
                "--cluster.settle-timeout=15s",
            ]
            argv += [
                f"--cluster.peer=127.0.0.1:{p[f'alertmanager-{j}-cluster']}"
                for j in range(1, self.peers + 1)
                if j != i
            ]
            argv += [f"--cluster.peer={peer}" for peer in self.cluster_peers]
            cmds[f"alertmanager-{i}"] = (
                argv,
                {},
                f"http://127.0.0.1:{p[f'alertmanager-{i}']}/-/healthy",
            )
            gate = [
                program("gate"),
                alert_gate.__file__,
                f"--listen={self.listen}:{p[f'gate-{i}']}",
                f"--alertmanager=http://127.0.0.1:{p[f'alertmanager-{i}']}",
                f"--credentials={self.secrets.push_credentials}",
                f"--admin-password-file={self.secrets.password_file}",
            ]
            if self.secure:
                crt, key = self.secrets.cert("central")
                gate += [f"--tls-cert={crt}", f"--tls-key={key}"]
            cmds[f"gate-{i}"] = (
                gate,
                {},
                f"{'https' if self.secure else 'http'}://{self.listen}:{p[f'gate-{i}']}/-/healthy",
            )
        for r in self.watchers:
            cmds[f"watcher-{r}"] = (
                [
                    program("prometheus"),
                    f"--config.file={w}/watcher-{r}.yml",
                    f"--storage.tsdb.path={d}/watcher-{r}",
                    f"--storage.tsdb.retention.time={RETENTION}",
                    f"--storage.tsdb.retention.size={RETENTION_SIZE}",
                    f"--web.listen-address=127.0.0.1:{p[f'watcher-{r}']}",
                    f"--web.cors.origin={CORS_ORIGIN}",
                    f"--web.config.file={w}/admin-web.yml",
                ],
                {},
                f"http://127.0.0.1:{p[f'watcher-{r}']}/-/ready",
            )
        argv = [
            thanos(),
            "query",
            f"--http-address=127.0.0.1:{p['query-http']}",
            f"--grpc-address=127.0.0.1:{p['query-grpc']}",
            "--query.replica-label=replica",
            f"--store.sd-files={self.inventory}",
            "--store.sd-interval=1m",
            f"--http.config={w}/admin-web.yml",
            "--log.level=warn",
        ]
        if self.secure:
            crt, key = self.secrets.cert("query")
            argv += [
                "--grpc-client-tls-secure",
                f"--grpc-client-tls-cert={crt}",
                f"--grpc-client-tls-key={key}",
                f"--grpc-client-tls-ca={self.secrets.ca}",
            ]
        cmds["query"] = (argv, {}, self.query_url("/-/ready"))
        if self.grafana:
            cmds["grafana"] = self._grafana_command()
        return cmds

    @property
    def extra(self):
        return [
            f"  pages file             {self.pages_file}",
            f"  inventory              {self.inventory}  (add hosts here; no restart)",
            f"  Grafana datasource     {self.query_url()}  (Thanos Query, replica label `replica`; "
            f"admin, password in {self.secrets.password_file})",
            *([] if self.grafana else [GRAFANA_HINT]),
        ]


ROLES = {"standalone": Standalone, "agent": Agent, "central": Central}


def make(
    name,
    state,
    ports=None,
    listen="127.0.0.1",
    auth=False,
    tls=None,
    host=None,
    replicas=(),
    alertmanagers=(),
    secrets=None,
    inventory=None,
    cluster_peers=(),
):
    """The role `name` on state, from the options of `stackctl.py up` (docs/fleet.md)."""
    if name == "standalone":
        return Standalone(state, ports, listen, auth=auth, tls=tls, grafana_server=grafana.find())
    secrets_dir = secrets or os.path.join(state, "secrets", "fleet")
    if name == "agent":
        if not alertmanagers:
            raise SystemExit(
                "--role agent needs --alertmanager ADDR:PORT for every central alert gate"
            )
        host = host or os.uname().nodename
        host_secrets = fleet_auth.HostSecrets(secrets_dir, host)
        for f in host_secrets.files(secure=not loopback(listen)):
            if not os.path.exists(f):
                raise SystemExit(
                    f"{f} missing: on the central side run `stackctl.py fleet-cert --host {host} "
                    f"--address {listen}` and copy the directory it names here (docs/fleet.md)"
                )
        return Agent(
            state,
            host,
            alertmanagers,
            host_secrets,
            replicas=replicas or ("A",),
            listen=listen,
            ports=ports,
        )
    fleet_secrets = fleet_auth.CentralSecrets(secrets_dir).ensure(
        server_names={"central": [listen, "127.0.0.1"]}, client_names=["query"]
    )
    return Central(
        state,
        inventory or os.path.join(state, "inventory.yml"),
        fleet_secrets,
        listen=listen,
        ports=ports,
        cluster_peers=cluster_peers or (),
        grafana_server=grafana.find(),
    )


def write_inventory(path, entries):
    """Replace the inventory atomically (rename), so a reader never sees half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(
            "# Fleet inventory (file_sd): one entry per agent Prometheus replica's Thanos sidecar.\n"
        )
        yaml.safe_dump(entries, f, sort_keys=False)
    os.replace(tmp, path)


def missing():
    """What the fleet roles need and cannot find here, each naming its make target."""
    problems = Stack(os.devnull, components=COMPONENTS).missing()
    if not os.access(THANOS, os.X_OK):
        problems.append(f"{THANOS} not found (run make thanos)")
    for tool in ("ip", "losetup", "fio", "openssl"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found (run make deps)")
    return problems
