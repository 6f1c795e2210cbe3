"""The fleet roles: configuration and commands for an `agent` (one monitored host) and the
`central` side, built from existing engines only.

agent (on every monitored host)
    node_exporter, blockstack-exporter, ebpf_exporter on 127.0.0.1 (lab/blockstack_lab/stack.py);
    one Prometheus per replica (A, B, ...) on 127.0.0.1 that scrapes them, evaluates
    alerts/*.rules.yml next to the data and sends alerts to every central Alertmanager peer;
    `external_labels: {host, replica}`; `replica` is dropped from alerts (alert_relabel_configs)
    so both replicas' alerts are the same alert to Alertmanager;
    one Thanos sidecar per replica: StoreAPI (gRPC, mutual TLS) and /metrics (HTTP, TLS + basic
    auth) on the host's fleet address.
central
    the page receiver (127.0.0.1); an Alertmanager cluster of `peers` peers (gossip on 127.0.0.1,
    or --cluster.peer to peers on other machines), web on the fleet address with TLS + basic auth;
    Thanos Query on 127.0.0.1 (Grafana's datasource) with --query.replica-label=replica, its
    StoreAPI endpoints read from the inventory file (--store.sd-files, re-read on change);
    a "watcher" Prometheus that scrapes every sidecar in the same inventory (file_sd) and raises
    BlockStackHostDown (fleet/fleet.rules.yml) to the Alertmanager cluster.

Inventory (file_sd style, one entry per agent Prometheus replica; the file can grow without a
restart: both Thanos Query and the watcher re-read it):

    - targets: ["10.0.0.11:10901"]                   # the sidecar's gRPC StoreAPI
      labels: {host: db1, replica: A, __http_address__: "10.0.0.11:10902"}   # its HTTP /metrics

Each component is (argv, env, health_url), the shape deploy/stackctl.py hands to supervisord.
"""
import base64
import os
import shutil
import ssl
import urllib.error
import urllib.request

import yaml

from blockstack_lab.stack import REPO, Stack, program, rule_files

THANOS = os.path.join(REPO, ".build", "bin", "thanos")
FLEET_RULES = os.path.join(REPO, "fleet", "fleet.rules.yml")
FLEET_USER = "fleet"
# bcrypt cost of every generated web password (fleet and `make up --listen/--auth`). Slow hashing
# protects guessable passwords from offline cracking; ours are generated 144-bit secrets, so it buys
# nothing, while every wrong password costs the server one hash: cost 12 was ~0.24 s of CPU per
# unauthenticated request (a CPU burn anyone who reaches the port can start), cost 6 is ~4 ms.
BCRYPT_COST = 6

# Default ports. An agent's are per host (the sidecar ports are the ones the inventory names);
# the central side's are on the central machine.
AGENT_PORTS = {"node": 9100, "blockstack": 9363, "ebpf": 9435,
               "prometheus-A": 9090, "prometheus-B": 9091,
               "sidecar-A-grpc": 10901, "sidecar-A-http": 10902,
               "sidecar-B-grpc": 10911, "sidecar-B-http": 10912}
CENTRAL_PORTS = {"receiver": 9466, "query-http": 10904, "query-grpc": 10903, "watcher-A": 9089, "watcher-B": 9088,
                 "alertmanager-1": 9093, "alertmanager-1-cluster": 9094,
                 "alertmanager-2": 9095, "alertmanager-2-cluster": 9096}


def thanos():
    if not os.access(THANOS, os.X_OK):
        raise FileNotFoundError(f"{THANOS} not found (run make thanos)")
    return THANOS


def loopback(addr):
    return addr in ("127.0.0.1", "localhost", "::1")


class Secrets:
    """The fleet's shared secrets in one directory (0700): the basic-auth password of user
    `fleet` (clients read it from `fleet-password`), its bcrypt hash, and the private CA with the
    certificates made from it (fleet/pki.py). The central side creates them; each agent gets
    ca.crt, its own cert/key and fleet-password (docs/fleet.md)."""

    def __init__(self, directory, user=FLEET_USER):
        self.dir = os.path.abspath(directory)
        self.user = user  # `make up --listen/--auth` (deploy/stackctl.py) uses user admin

    @property
    def password_file(self):
        return os.path.join(self.dir, f"{self.user}-password")

    @property
    def ca(self):
        return os.path.join(self.dir, "ca.crt")

    def cert(self, name):
        return os.path.join(self.dir, f"{name}.crt"), os.path.join(self.dir, f"{name}.key")

    def password(self):
        import secrets as pysecrets
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        if not os.path.exists(self.password_file):
            _write_private(self.password_file, pysecrets.token_urlsafe(18) + "\n")
        with open(self.password_file) as f:
            return f.read().strip()

    def hashed(self):
        """bcrypt of the password, made once (bcrypt is slow on purpose; the servers cache it)."""
        import bcrypt
        path = os.path.join(self.dir, f"{self.user}-password.bcrypt")
        if not os.path.exists(path) or f"${BCRYPT_COST:02d}$" not in open(path).read(30):  # made at another cost
            _write_private(path, bcrypt.hashpw(self.password().encode(), bcrypt.gensalt(rounds=BCRYPT_COST)).decode())
        with open(path) as f:
            return f.read().strip()

    def ensure(self, server_names=(), client_names=()):
        """CA, password and the named certificates: {name: [addresses]} servers, [names] clients."""
        from . import pki
        self.password()
        pki.make_ca(self.dir)
        for name, hosts in dict(server_names).items():
            pki.make_cert(self.dir, name, hosts)
        for name in client_names:
            pki.make_cert(self.dir, name, client=True)
        return self

    def web_config(self, path, cert_name=None):
        """A Prometheus-family web config (exporter-toolkit: Prometheus, Alertmanager, Thanos
        --http.config): basic auth for user `fleet`, TLS with cert_name's certificate if given."""
        config = {"basic_auth_users": {self.user: self.hashed()}}
        if cert_name:
            crt, key = self.cert(cert_name)
            config["tls_server_config"] = {"cert_file": crt, "key_file": key, "min_version": "TLS12"}
        text = (f"# rendered by fleet/roles.py: basic auth (user {self.user}) and TLS for "
                "listeners beyond loopback\n" + yaml.safe_dump(config, sort_keys=False))
        try:
            with open(path) as f:
                if f.read() == text:
                    return path
        except FileNotFoundError:
            pass
        _write_private(path, text)
        return path

    def client_http(self, tls=True):
        """The `basic_auth` (+ `tls_config`) block of a Prometheus scrape or alerting config."""
        block = {"basic_auth": {"username": self.user, "password_file": self.password_file}}
        if tls:
            block["scheme"] = "https"
            block["tls_config"] = {"ca_file": self.ca}
        return block


def _write_private(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _dump(path, config, header="# rendered by fleet/roles.py: edit the source, not this file\n"):
    text = header + yaml.safe_dump(config, sort_keys=False)
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except FileNotFoundError:
        pass
    with open(path, "w") as f:
        f.write(text)
    return True


def probe(url, auth=None, ca=None, timeout=2):
    """True when something answers HTTP at url: 2xx, or 401 when no credentials were given
    (basic auth on: the server is up). https is verified against `ca` when given."""
    ctx = None
    if url.startswith("https:"):
        ctx = ssl.create_default_context(cafile=ca) if ca else ssl._create_unverified_context()
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            r.read()
        return True
    except urllib.error.HTTPError as e:
        return e.code == 401 and not auth
    except OSError:
        return False


class Agent:
    """One monitored host: exporters, `replicas` Prometheus with identical rules, a sidecar each."""

    def __init__(self, workdir, host, alertmanagers, secrets=None, replicas=("A",), listen="127.0.0.1",
                 data_dir=None, ports=None, devices=None, scrape_interval="5s", ebpf_configs=None,
                 components=("node", "blockstack", "ebpf")):
        """alertmanagers: ["ADDR:PORT", ...] every central peer. secrets: a Secrets with this
        host's certificate named `host` (needed when listen is not loopback). devices: a regex
        of the block devices this host owns; only for simulated hosts sharing one kernel (the
        fleet test), real hosts own every device they see."""
        self.workdir = os.path.abspath(workdir)
        self.data_dir = os.path.abspath(data_dir or workdir)
        self.host, self.replicas, self.listen = host, list(replicas), listen
        self.alertmanagers, self.secrets, self.devices = list(alertmanagers), secrets, devices
        self.ports = {**AGENT_PORTS, **(ports or {})}
        self.exporters = Stack(self.workdir, host=host, components=components, scrape_interval=scrape_interval,
                               evaluation_interval=scrape_interval, ebpf_configs=ebpf_configs,
                               ports={c: self.ports[c] for c in components}, data_dir=self.data_dir)
        if not loopback(listen) and secrets is None:
            raise ValueError("an agent listening beyond loopback needs the fleet secrets (TLS, basic auth)")

    @property
    def secure(self):
        return not loopback(self.listen)

    def inventory_entries(self, address=None):
        """This agent's lines for the central inventory."""
        address = address or self.listen
        return [{"targets": [f"{address}:{self.ports[f'sidecar-{r}-grpc']}"],
                 "labels": {"host": self.host, "replica": r,
                            "__http_address__": f"{address}:{self.ports[f'sidecar-{r}-http']}"}}
                for r in self.replicas]

    def prometheus_config(self, replica):
        base = self.exporters.prometheus_config()
        scrape_configs = base["scrape_configs"]
        if self.devices:
            # Simulated hosts share one kernel: keep only this host's devices (and series that
            # have no device label at all).
            for sc in scrape_configs:
                sc["metric_relabel_configs"] = [{"source_labels": ["device"], "regex": f"({self.devices})?",
                                                 "action": "keep"}]
        am = {"static_configs": [{"targets": self.alertmanagers}], "timeout": "10s"}
        if self.secrets and os.path.exists(self.secrets.password_file):
            # The central Alertmanagers take TLS + basic auth whenever they listen beyond loopback.
            central_secure = not all(loopback(a.rsplit(":", 1)[0]) for a in self.alertmanagers)
            am.update(self.secrets.client_http(tls=central_secure))
        return {
            "global": {**base["global"], "external_labels": {"host": self.host, "replica": replica}},
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
        os.makedirs(self.workdir, exist_ok=True)
        changed = False
        for r in self.replicas:
            changed |= _dump(os.path.join(self.workdir, f"prometheus-{r}.yml"), self.prometheus_config(r))
        if self.secure:
            self.secrets.web_config(os.path.join(self.workdir, "web-config.yml"), cert_name=self.host)
        return changed

    def url(self, name, path=""):
        return f"http://127.0.0.1:{self.ports[name]}{path}"

    def commands(self):
        cmds = self.exporters.commands()
        w, d = self.workdir, self.data_dir
        for r in self.replicas:
            prom = self.ports[f"prometheus-{r}"]
            cmds[f"prometheus-{r}"] = (
                [program("prometheus"), f"--config.file={w}/prometheus-{r}.yml",
                 f"--storage.tsdb.path={d}/prometheus-{r}", "--storage.tsdb.retention.time=15d",
                 # Thanos: fixed 2 h blocks, so a sidecar with an object store uploads every block.
                 "--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h",
                 f"--web.listen-address=127.0.0.1:{prom}", "--web.enable-lifecycle"],
                {}, self.url(f"prometheus-{r}", "/-/ready"))
            argv = [thanos(), "sidecar", f"--prometheus.url=http://127.0.0.1:{prom}",
                    f"--tsdb.path={d}/prometheus-{r}",
                    f"--grpc-address={self.listen}:{self.ports[f'sidecar-{r}-grpc']}",
                    f"--http-address={self.listen}:{self.ports[f'sidecar-{r}-http']}", "--log.level=warn"]
            scheme = "http"
            if self.secure:
                crt, key = self.secrets.cert(self.host)
                argv += [f"--grpc-server-tls-cert={crt}", f"--grpc-server-tls-key={key}",
                         f"--grpc-server-tls-client-ca={self.secrets.ca}", f"--http.config={w}/web-config.yml"]
                scheme = "https"
            cmds[f"sidecar-{r}"] = (argv, {}, f"{scheme}://{self.listen}:{self.ports[f'sidecar-{r}-http']}/-/ready")
        return cmds


class Central:
    """The central side: receiver, Alertmanager cluster, Thanos Query, the watcher Prometheus."""

    def __init__(self, workdir, inventory, secrets, listen="127.0.0.1", data_dir=None, ports=None, peers=2,
                 cluster_peers=(), watchers=("A",), scrape_interval="5s", host_down_for=None,
                 cert_name="central"):
        """inventory: the file_sd file of every agent sidecar. listen: the address agents reach
        the Alertmanager peers on (TLS + basic auth when not loopback). cluster_peers: Alertmanager
        peers on other machines (ADDR:PORT of their cluster listener)."""
        self.workdir = os.path.abspath(workdir)
        self.data_dir = os.path.abspath(data_dir or workdir)
        self.inventory, self.secrets, self.listen = os.path.abspath(inventory), secrets, listen
        self.peers, self.cluster_peers, self.watchers = peers, list(cluster_peers), list(watchers)
        self.scrape_interval, self.host_down_for, self.cert_name = scrape_interval, host_down_for, cert_name
        self.ports = {**CENTRAL_PORTS, **(ports or {})}
        for i in range(1, peers + 1):
            self.ports.setdefault(f"alertmanager-{i}", 9093 + 2 * (i - 1))
            self.ports.setdefault(f"alertmanager-{i}-cluster", 9094 + 2 * (i - 1))
        for r in self.watchers:
            self.ports.setdefault(f"watcher-{r}", 9089 - (ord(r) - ord("A")))
        self.receiver_stack = Stack(self.workdir, components=("receiver", "alertmanager"),
                                    ports={"receiver": self.ports["receiver"], "alertmanager": self.ports["alertmanager-1"]})

    @property
    def secure(self):
        return not loopback(self.listen)

    @property
    def pages_file(self):
        return self.receiver_stack.pages_file

    def alertmanager_addresses(self):
        return [f"{self.listen}:{self.ports[f'alertmanager-{i}']}" for i in range(1, self.peers + 1)]

    def alertmanager_url(self, i, path=""):
        return f"{'https' if self.secure else 'http'}://{self.listen}:{self.ports[f'alertmanager-{i}']}{path}"

    def query_url(self, path=""):
        return f"http://127.0.0.1:{self.ports['query-http']}{path}"

    def watcher_config(self, replica):
        agent_job = {
            "job_name": "fleet-agent",
            "scrape_interval": self.scrape_interval,
            "file_sd_configs": [{"files": [self.inventory], "refresh_interval": "1m"}],
            "relabel_configs": [{"source_labels": ["__http_address__"], "target_label": "__address__"}],
            # `up` is what the watcher is for; of the sidecar's own few hundred series keep only
            # whether it reaches its Prometheus (a few series per replica at 1,000 hosts).
            "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": "thanos_sidecar_prometheus_up",
                                        "action": "keep"}],
        }
        if self.secrets:
            agent_job.update(self.secrets.client_http(tls=True) if self.secure else
                             {"basic_auth": self.secrets.client_http(tls=False)["basic_auth"]})
        am = {"static_configs": [{"targets": self.alertmanager_addresses()}], "timeout": "10s"}
        if self.secrets and self.secure:
            am.update(self.secrets.client_http(tls=True))
        return {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval,
                       "external_labels": {"watcher": replica}},
            "rule_files": [os.path.join(self.workdir, "fleet.rules.yml")],
            "scrape_configs": [agent_job],
            "alerting": {"alert_relabel_configs": [{"action": "labeldrop", "regex": "watcher"}],
                         "alertmanagers": [am]},
        }

    def render(self):
        os.makedirs(self.workdir, exist_ok=True)
        if not os.path.exists(self.inventory):
            os.makedirs(os.path.dirname(self.inventory), exist_ok=True)
            with open(self.inventory, "w") as f:
                f.write("# Fleet inventory (file_sd): one entry per agent Prometheus replica's Thanos sidecar.\n"
                        "# Thanos Query and the watcher re-read this file on change; see docs/fleet.md.\n[]\n")
        changed = _dump(os.path.join(self.workdir, "alertmanager.yml"), self.receiver_stack.alertmanager_config())
        with open(FLEET_RULES) as f:
            rules = f.read()
        if self.host_down_for:
            rules = rules.replace("for: 1m  # host-down", f"for: {self.host_down_for}  # host-down")
        with open(os.path.join(self.workdir, "fleet.rules.yml"), "w") as f:
            f.write(rules)
        for r in self.watchers:
            changed |= _dump(os.path.join(self.workdir, f"watcher-{r}.yml"), self.watcher_config(r))
        if self.secure:
            self.secrets.web_config(os.path.join(self.workdir, "web-config.yml"), cert_name=self.cert_name)
        return changed

    def commands(self):
        w, d, p = self.workdir, self.data_dir, self.ports
        cmds = {"receiver": self.receiver_stack.commands()["receiver"]}
        for i in range(1, self.peers + 1):
            argv = [program("alertmanager"), f"--config.file={w}/alertmanager.yml",
                    f"--storage.path={d}/alertmanager-{i}", f"--web.listen-address={self.listen}:{p[f'alertmanager-{i}']}",
                    f"--cluster.listen-address=127.0.0.1:{p[f'alertmanager-{i}-cluster']}",
                    f"--cluster.advertise-address=127.0.0.1:{p[f'alertmanager-{i}-cluster']}",
                    "--cluster.settle-timeout=15s"]
            argv += [f"--cluster.peer=127.0.0.1:{p[f'alertmanager-{j}-cluster']}"
                     for j in range(1, self.peers + 1) if j != i]
            argv += [f"--cluster.peer={peer}" for peer in self.cluster_peers]
            if self.secure:
                argv.append(f"--web.config.file={w}/web-config.yml")
            cmds[f"alertmanager-{i}"] = (argv, {}, self.alertmanager_url(i, "/-/healthy"))
        for r in self.watchers:
            cmds[f"watcher-{r}"] = ([program("prometheus"), f"--config.file={w}/watcher-{r}.yml",
                                     f"--storage.tsdb.path={d}/watcher-{r}", "--storage.tsdb.retention.time=15d",
                                     f"--web.listen-address=127.0.0.1:{p[f'watcher-{r}']}", "--web.enable-lifecycle"],
                                    {}, f"http://127.0.0.1:{p[f'watcher-{r}']}/-/ready")
        argv = [thanos(), "query", f"--http-address=127.0.0.1:{p['query-http']}",
                f"--grpc-address=127.0.0.1:{p['query-grpc']}", "--query.replica-label=replica",
                f"--store.sd-files={self.inventory}", "--store.sd-interval=1m", "--log.level=warn"]
        if self.secure:
            crt, key = self.secrets.cert("query")
            argv += ["--grpc-client-tls-secure", f"--grpc-client-tls-cert={crt}", f"--grpc-client-tls-key={key}",
                     f"--grpc-client-tls-ca={self.secrets.ca}"]
        cmds["query"] = (argv, {}, self.query_url("/-/ready"))
        return cmds


def write_inventory(path, entries):
    """Replace the inventory atomically (rename), so a reader never sees half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("# Fleet inventory (file_sd): one entry per agent Prometheus replica's Thanos sidecar.\n")
        yaml.safe_dump(entries, f, sort_keys=False)
    os.replace(tmp, path)


def missing():
    """What the fleet roles need and cannot find here, each naming its make target."""
    problems = []
    for component in ("node", "blockstack", "ebpf", "prometheus", "alertmanager", "receiver"):
        try:
            program(component)
        except FileNotFoundError as e:
            problems.append(str(e))
    if not os.access(THANOS, os.X_OK):
        problems.append(f"{THANOS} not found (run make thanos)")
    for tool in ("ip", "losetup", "fio", "openssl"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found (run make deps)")
    return problems


__all__ = ["Agent", "Central", "Secrets", "probe", "write_inventory", "missing", "rule_files"]
