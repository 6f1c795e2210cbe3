"""standalone (`make up`): the single-host stack of stack.py and Grafana, all on 127.0.0.1;
`--listen ADDR` or `--auth` put Prometheus, Alertmanager and Grafana behind TLS + basic auth
(user admin, pki.Secrets)."""

import os
import socket

from .. import pki
from ..files import write_if_changed
from ..stack import COMPONENTS, Stack, servers_name
from .base import GRAFANA_HINT, Role, ebpf_summary, loopback, self_pages_dir


class Standalone(Role):
    """The single-host stack (stack.Stack) and Grafana; TLS + basic auth beyond loopback or with
    auth."""

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
        external_host=None,
    ):
        """tls: the operator's (cert, key, ca) instead of the generated ones, copied into
        STATE/secrets. external_host: the name readers of a page use to reach this host
        (Stack.external_host; in the generated certificate too)."""
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
        self.stack.external_host = external_host
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
        # Prometheus takes the admin password, Alertmanager its own (self.silencer), in every mode
        # (plain HTTP on loopback by default); the exporters with a /debug/pprof/ answer /metrics
        # only (metrics_front.py)
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
        # Alertmanager's own user and password: a reader of Prometheus (Grafana's datasource)
        # cannot silence a page
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
            "datasource_auth": (self.admin.user, self.admin.password_file, None),  # Prometheus's
            "root_url": self.stack.external_url("grafana", self.ports["grafana"]),
            "prometheus_url": self.stack.external_url("prometheus"),
        }
        if self.web:
            auth |= {
                "tls": self.web.cert(self.cert_name),
                "datasource_auth": (self.web.user, self.web.password_file, self.ca),
            }
        return self._render_grafana(self.stack.url("prometheus"), **auth)

    def _render_web_auth(self):
        """STATE/secrets: the admin password, its bcrypt, a CA and the listeners' certificate (for
        127.0.0.1, localhost, this host's name and --listen) or the operator's; the web config of
        Prometheus and Alertmanager."""
        # the operator's: it must name --listen ADDR (127.0.0.1 for 0.0.0.0/--auth): the stack's
        # clients go there
        if self.tls:
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
            if self.stack.external_host:  # the links of a page name it
                names.append(self.stack.external_host)
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
            f"Block Stack Merges is up ({elapsed:.1f} s), state in {self.state}, "
            f"servers: {servers_name()}",
            f"  Prometheus     {scheme}://{host}:{p['prometheus']}/   "
            f"(alerts: /alerts; admin, password in {self.admin.password_file})",
            f"  Alertmanager   {scheme}://{host}:{p['alertmanager']}/   "
            f"(alertmanager, password in {self.silencer.password_file})",
            f"  pages file     {self.stack.pages_file}",
            f"  pager's own    {self.stack.self_pages_file}   "
            "(the second notifier: the pager's own failures)",
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
