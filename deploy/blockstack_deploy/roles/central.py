"""central (`make up-central`): the page receiver (127.0.0.1); an Alertmanager cluster of `peers`
peers (gossip on 127.0.0.1, or --cluster.peer to peers on other machines), web on 127.0.0.1
behind the admin password, each behind an alert gate (alert_gate.py) on the fleet address that
takes only hosts' pushes; Thanos Query on 127.0.0.1 behind the admin password (Grafana's
datasource) with --query.replica-label=replica, its StoreAPI endpoints read from the inventory
file (--store.sd-files, re-read on change); a "watcher" Prometheus (admin password too) that
scrapes every sidecar in the same inventory (file_sd) and raises BlockStackHostDown
(alerts/fleet.rules.yml) to the Alertmanager cluster; Grafana.

Inventory (file_sd style, one entry per agent Prometheus replica; the file can grow without a
restart: both Thanos Query and the watcher re-read it):

    - targets: ["10.0.0.11:10901"]                   # the sidecar's gRPC StoreAPI
      labels: {host: db1, replica: A, __http_address__: "10.0.0.11:10902"}   # its HTTP /metrics
"""

import os

import yaml

from blockstack_rules import knobs

from .. import alert_gate
from ..files import secret, write_if_changed, write_yaml
from ..stack import CORS_ORIGIN, DOCS_HTML, RETENTION, RETENTION_SIZE, Stack, program
from .base import GRAFANA_HINT, FleetRole, thanos

SOURCE = "blockstack_deploy/roles/central.py"


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
        listen: the address agents reach the alert gates on (TLS when not loopback).
        cluster_peers: Alertmanager peers on other machines (ADDR:PORT of their cluster
        listener)."""
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
                    "# Fleet inventory (file_sd): one entry per agent Prometheus replica's "
                    "Thanos sidecar.\n# Thanos Query and the watcher re-read this file on change; "
                    "see docs/fleet.md.\n[]\n"
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
        # the Alertmanager peers, the watchers and Thanos Query (and their /debug/pprof/): the admin
        # password
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
                f"--web.external-url=http://127.0.0.1:{p[f'alertmanager-{i}']}",
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
                    # a page's links (generatorURL, the fleet runbook at /user/) where it listens
                    f"--web.external-url=http://127.0.0.1:{p[f'watcher-{r}']}",
                    f"--web.user-assets={DOCS_HTML}",
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


def write_inventory(path, entries):
    """Replace the inventory atomically (rename), so a reader never sees half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(
            "# Fleet inventory (file_sd): one entry per agent Prometheus replica's "
            "Thanos sidecar.\n"
        )
        yaml.safe_dump(entries, f, sort_keys=False)
    os.replace(tmp, path)
