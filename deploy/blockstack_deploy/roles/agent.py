"""agent (`make up-agent`, on every monitored host): node_exporter, blockstack-exporter,
ebpf_exporter on 127.0.0.1 (stack.py; node_exporter and ebpf_exporter behind metrics_front.py,
as in standalone); one Prometheus per replica (A, B, ...) on 127.0.0.1 behind a local admin
password that scrapes them, evaluates alerts/{alerts,recording}.rules.yml next to the data and
sends alerts to every central alert gate with the host's own push secret;
`external_labels: {host, replica}`; `replica` is dropped from alerts (alert_relabel_configs) so
both replicas' alerts are the same alert to Alertmanager; one Thanos sidecar per replica:
StoreAPI (gRPC, mutual TLS) and /metrics (HTTP, the central's scrape user; TLS beyond loopback)
on the host's fleet address, reading its Prometheus with the local password."""

import os

from .. import pki
from ..files import write_yaml
from ..stack import CORS_ORIGIN, DOCS_HTML, RETENTION, RETENTION_SIZE, Stack, program
from .base import FleetRole, ebpf_summary, loopback, thanos

SOURCE = "blockstack_deploy/roles/agent.py"


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
                "an agent needs its fleet secrets "
                "(fleet_auth.HostSecrets: push secret, scrape hash)"
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
                    # Thanos: fixed 2 h blocks, so a sidecar with an object store uploads every
                    # block.
                    "--storage.tsdb.min-block-duration=2h",
                    "--storage.tsdb.max-block-duration=2h",
                    # no --web.enable-lifecycle: POST /-/quit exits 0, which Restart=on-failure does
                    # not restart; reloads are SIGHUP (self.reloads)
                    f"--web.listen-address=127.0.0.1:{prom}",
                    # a page's links (generatorURL, the runbook at /user/) where it listens
                    f"--web.external-url=http://127.0.0.1:{prom}",
                    f"--web.user-assets={DOCS_HTML}",
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
