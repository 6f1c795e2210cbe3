"""The stack on one host — exporters, Prometheus, Alertmanager, the page receiver — as
configuration rendered into one directory and the command line of each program, every port on
127.0.0.1: the scrape config, the exporters' flags, Prometheus's retention. The roles
(roles/) hand these commands to supervisord (`make up`) or systemd (systemd.py); the tests and
the lab start them directly (Stack.running).
"""

import contextlib
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse

import yaml

from blockstack_rules import knobs

from . import grafana, metrics_front, paging, privileges, procs
from .files import secret, write_yaml
from .paths import BUILD, PYTHON, REPO, VENV_BIN
from .versions import ALERTMANAGER_UPSTREAM_VERSION, PROMETHEUS3_VERSION

EBPF_EXPORTER = os.path.join(BUILD, "bin", "ebpf_exporter")
EBPF_CONFIG_DIR = os.path.join(BUILD, "ebpf-configs")
# node_exporter's default --collector.diskstats.device-exclude drops loop devices and
# partitions; the stack must see every layer, so only RAM disks, floppies and CD-ROMs go.
DISKSTATS_EXCLUDE = r"^(ram|fd|sr)\d+$"
# receiver-self: the second notifier, a page receiver of the pager's own alerts that shares
# neither the page receiver's process nor its disk (alerts/alertmanager.yml `pagerself`)
COMPONENTS = (
    "node",
    "blockstack",
    "ebpf",
    "receiver",
    "receiver-self",
    "alertmanager",
    "prometheus",
)
# The local webhooks of alerts/alertmanager.yml by port: the component each goes to.
LOCAL_WEBHOOKS = {9466: "receiver", 9467: "receiver-self"}
RETENTION = "15d"
RESEND_DELAY = "15s"  # Prometheus -> Alertmanager, see the prometheus command
# The TSDB deletes its oldest blocks past this size, before the disk it shares with the pages file
# fills (BlockStackPagerDiskFilling warns before either happens).
RETENTION_SIZE = "8GB"
# Prometheus answers cross-origin reads only for these origins (its default `.*` lets any web page
# open in a browser on this host read every series); it has no write endpoint without the admin
# and lifecycle APIs, which the stack never enables.
CORS_ORIGIN = r"https?://(127\.0\.0\.1|localhost)(:[0-9]+)?"
# The documents a page links to, as HTML (rendered by `make generate`: blockstack_rules/docs.py).
# Prometheus serves them at <its external URL>/user/ (--web.user-assets): an alert's runbook_url,
# {{ $externalURL }}/user/runbook.html#..., opens on the Prometheus that evaluated it.
DOCS_HTML = os.path.join(REPO, "docs", "html")


def which(*names, target="deps"):
    """The first of names (on PATH, or absolute paths) that is an executable here."""
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    raise FileNotFoundError(f"{' or '.join(names)} not found (run make {target})")


# Each component's program (names on PATH or absolute paths, the first found wins) and the make
# target that installs or builds it.
PROGRAMS = {
    "node": (("prometheus-node-exporter", "node_exporter"), "deps"),
    "blockstack": ((os.path.join(VENV_BIN, "blockstack-exporter"),), "venv"),
    "ebpf": ((EBPF_EXPORTER,), "ebpf-build"),
    "receiver": ((PYTHON,), "venv"),
    "receiver-self": ((PYTHON,), "venv"),
    "gate": ((PYTHON,), "venv"),  # alert_gate.py, metrics_front.py
}

# The Prometheus-family servers and their tools, in two tested sets (docs/deploy.md):
#   debian    Debian 12's packages: Prometheus 2.42, Alertmanager 0.25
#   upstream  Prometheus 3 and a current Alertmanager, built from the Go module proxy into
#             .build/bin by `make upstream-servers` (their versions: versions.py)
# `servers=` of Stack and program() picks one; else $BLOCKSTACK_SERVERS, else DEFAULT_SERVERS.
DEFAULT_SERVERS = "debian"
SERVERS = {
    "debian": {
        "prometheus": (("prometheus",), "deps"),
        "promtool": (("promtool",), "deps"),
        "alertmanager": (("prometheus-alertmanager", "alertmanager"), "deps"),
        "amtool": (("amtool",), "deps"),
    },
    "upstream": {
        tool: ((os.path.join(BUILD, "bin", f"{tool}-{version}"),), "upstream-servers")
        for tool, version in (
            ("prometheus", PROMETHEUS3_VERSION),
            ("promtool", PROMETHEUS3_VERSION),
            ("alertmanager", ALERTMANAGER_UPSTREAM_VERSION),
            ("amtool", ALERTMANAGER_UPSTREAM_VERSION),
        )
    },
}


def servers_name(servers=None):
    name = servers or os.environ.get("BLOCKSTACK_SERVERS") or DEFAULT_SERVERS
    if name not in SERVERS:
        raise ValueError(f"servers {name!r}: expected one of {', '.join(SERVERS)}")
    return name


def program(component, servers=None):
    """The executable of a component (or of promtool/amtool) for the chosen set of servers."""
    names, target = PROGRAMS.get(component) or SERVERS[servers_name(servers)][component]
    return which(*names, target=target)


def ebpf_config_names(cache=None, status_file=None):
    """The ebpf_exporter configs this kernel can load, comma-separated: "" where none does (a kernel
    before 5.10 or without BTF; select-configs.sh says why on stderr), and select-configs.sh's
    status of every set in status_file (blockstack-exporter's --collector.ebpf.status-file). With
    cache (a file), probed once per kernel and build of the BPF objects, the status kept beside it
    (ebpf_status_file)."""
    if not cache:
        return _select_configs(status_file)
    status_file = ebpf_status_file(cache)
    key = f"{os.uname().release} {_mtime(EBPF_CONFIG_DIR)} {' '.join(_probe_identity())}"
    try:
        with open(cache) as f:
            cached_key, names = f.read().split("\n")[:2]
        if cached_key == key and os.path.exists(status_file):
            return names
    except (FileNotFoundError, ValueError):
        pass
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    names = _select_configs(status_file)
    with open(cache, "w") as f:
        f.write(f"{key}\n{names}\n")
    return names


def ebpf_status_file(cache):
    """Where ebpf_config_names(cache) keeps the status of each set of BPF programs."""
    return os.path.join(os.path.dirname(cache), "ebpf-status.tsv")


def _probe_identity():
    """The setpriv prefix that gives select-configs.sh's checks ebpf_exporter's own user and
    capabilities (privileges.wrap; nothing when not root): a config is chosen only if ebpf_exporter
    can attach it as it will run. jbd2's fexit variant needs module BTF, which libbpf opens only
    with CAP_SYS_ADMIN, which ebpf_exporter is not given: a tracepoint variant is chosen there
    (docs/deploy.md, "Users and capabilities")."""
    if not privileges.enabled():
        return []
    privileges.ensure_users()
    return privileges.wrap("ebpf", [])


def _select_configs(status_file=None):
    env = dict(os.environ, SELECT_CONFIGS_AS=" ".join(_probe_identity()))
    r = subprocess.run(
        [
            os.path.join(REPO, "ebpf-configs", "select-configs.sh"),
            EBPF_EXPORTER,
            EBPF_CONFIG_DIR,
            *([status_file] if status_file else []),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if r.stderr.strip():
        print(r.stderr.strip(), file=sys.stderr)
    return r.stdout.strip()


def ebpf_keep_capabilities(release):
    """ebpf_exporter's --capabilities.keep on a kernel `release`: every capability is dropped once
    the programs are attached, except where the kernel then refuses it its own maps. Before 5.19
    kernel.unprivileged_bpf_disabled (Debian's default 2) refused every bpf() command, reading a
    map included, to a process without CAP_BPF or CAP_SYS_ADMIN; "bpf: Refine
    kernel.unprivileged_bpf_disabled behaviour" (5.19) limited it to creating maps and loading
    programs. So CAP_BPF stays there (5.10 in the VM lab: every histogram empty without it)."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return "none" if m and (int(m[1]), int(m[2])) >= (5, 19) else "cap_bpf"


def _btf_path():
    """--btf.path from $BTF_PATH: a BTF file for a kernel without /sys/kernel/btf/vmlinux
    (select-configs.sh reads the same variable)."""
    return [f"--btf.path={os.environ['BTF_PATH']}"] if os.environ.get("BTF_PATH") else []


def _mtime(path):
    try:
        return int(max(os.stat(os.path.join(path, f)).st_mtime for f in os.listdir(path)))
    except (FileNotFoundError, ValueError):
        return 0


class Stack:
    """Configuration and commands for one stack in `workdir`, every port on 127.0.0.1."""

    def __init__(
        self,
        workdir,
        host=None,
        components=COMPONENTS,
        scrape_interval="5s",
        evaluation_interval="5s",
        ports=None,
        ebpf_configs=None,
        data_dir=None,
        servers=None,
        ebpf_cache=None,
    ):
        self.servers = servers_name(servers)  # debian or upstream: see SERVERS
        self.workdir = os.path.abspath(workdir)
        self.data_dir = os.path.abspath(data_dir or workdir)  # TSDB and Alertmanager state
        self.host = host or socket.gethostname()
        self.components = list(components)
        self.scrape_interval, self.evaluation_interval = scrape_interval, evaluation_interval
        self.ports = dict(ports or {})
        for c in self.components:
            self.ports.setdefault(c, procs.free_port())
        self._ebpf_configs, self._ebpf_cache = ebpf_configs, ebpf_cache
        # select-configs.sh's status of each set of BPF programs, which blockstack-exporter
        # publishes (blockstack_ebpf_set_loaded): written when the stack probes the kernel, beside
        # the cache or in workdir; where the configs are given, a status file put there (or none)
        self.ebpf_status_file = ebpf_status_file(
            ebpf_cache or os.path.join(self.workdir, "ebpf-configs.txt")
        )
        self.kernel_release = (
            os.uname().release
        )  # the kernel ebpf_exporter runs on (the VM lab: a guest's)
        # The exposed mode (roles.Standalone): Prometheus and Alertmanager bind web_listen and serve
        # web_config_file (TLS + basic auth); web_client is the basic_auth (+ scheme/tls_config)
        # block Prometheus uses to reach them (pki.Secrets.client_http), at web_address.
        self.web_listen = self.web_address = "127.0.0.1"
        self.web_config_file = self.web_client = None
        # Basic auth on Prometheus and Alertmanager even on loopback (roles.Standalone's default
        # mode): their web config and the basic_auth block their clients send. Alertmanager answers
        # any origin's CORS preflight with `*`, so without a password a web page could silence
        # pages; both serve Go's /debug/pprof/, which no flag turns off.
        self.loopback_web_config = self.loopback_client = None
        # (web config file, client block) of Alertmanager when it has credentials of its own
        # (roles.Standalone: whoever reads Prometheus cannot silence a page); else the ones above.
        self.alertmanager_auth = None
        # With a directory: node_exporter and ebpf_exporter serve HTTP on Unix sockets in
        # DIR/node and DIR/ebpf, and metrics_front.py (program "front") answers their ports with
        # /metrics only (their /debug/pprof/ has no off switch, ebpf_exporter no web config).
        self.metrics_socket_dir = None
        # With a path: blockstack-exporter asks the dm helper there (dm_helper.py, program "dm",
        # the only holder of CAP_SYS_ADMIN) instead of running dmsetup (roles: where the kernel has dm).
        self.dm_helper_socket = None
        # The bearer token Alertmanager's webhooks send the receiver (generated 0600 by render).
        self.receiver_token_file = os.path.join(self.workdir, "receiver-token")
        self.pages_file = os.path.join(
            self.workdir, "pages.jsonl"
        )  # the receiver's (roles: STATE/pages/)
        # receiver-self's: not on the pages' filesystem (roles: under /run)
        self.self_pages_file = os.path.join(self.workdir, "self-pages", "pages.jsonl")
        # The off-host dead man's switch's URL (a secret), passed to the receiver when the file exists.
        self.heartbeat_url_file = None
        # More of the stack's own servers to scrape: {job: (address:port, scheme)} (roles.Standalone: Grafana).
        self.also_scrape = {}
        # E-mail and a chat or incident service beside the local receiver (paging.py; the roles set
        # its secrets directory); empty: the local webhooks alone.
        self.paging = paging.Paging(secrets_dir=os.path.join(self.workdir, "secrets"))
        # The name a reader of a page uses to reach this host's Prometheus, Alertmanager and
        # Grafana (stackctl --external-host, EXTERNAL_HOST in the package's configuration); None:
        # the address they listen on (external_url).
        self.external_host = None
        # The rule files Prometheus evaluates: the host's (not the fleet watcher's); a test gives
        # copies rendered with other knobs (knobs.rule_files)
        self.rule_files = [str(p) for p in knobs.HOST_RULES]

    @property
    def ebpf_configs(self):
        """The configs ebpf_exporter loads ("" where none loads on this kernel: it is not started,
        not scraped, and blockstack-exporter's status says why)."""
        if self._ebpf_configs is None:
            self._ebpf_configs = ebpf_config_names(self._ebpf_cache, self.ebpf_status_file)
        return self._ebpf_configs

    @property
    def runs_ebpf(self):
        return "ebpf" in self.components and bool(self.ebpf_configs)

    def missing(self):
        """What this stack needs and cannot find here, each naming the make target that provides it."""
        problems = []
        for component in self.components:
            if component == "grafana":
                problems += [] if grafana.find() else [grafana.HINT + " (run make grafana)"]
                continue
            try:
                program(component, self.servers)
            except FileNotFoundError as e:
                problems.append(str(e))
        if "ebpf" in self.components and not glob.glob(os.path.join(EBPF_CONFIG_DIR, "*.bpf.o")):
            problems.append(f"no compiled BPF configs in {EBPF_CONFIG_DIR} (run make ebpf-build)")
        return problems

    def url(self, component, path=""):
        return f"{self.scheme(component)}://{self.address(component)}:{self.ports[component]}{path}"

    def scheme(self, component):
        secure = (
            self.web_client
            and self.web_client.get("scheme") == "https"
            and component in self.AUTH_COMPONENTS
        )
        return "https" if secure else "http"

    def address(self, component):
        return self.web_address if component in self.AUTH_COMPONENTS else "127.0.0.1"

    def external_url(self, component, port=None):
        """Where a person reading a page reaches one of the stack's servers: its
        --web.external-url (Prometheus's generatorURL and $externalURL, the runbook link;
        Alertmanager's externalURL in every notification), Grafana's root_url. The external host
        when set; else the address it listens on (the host's name for all addresses: Prometheus's
        own default), never a name that resolves elsewhere while it listens on 127.0.0.1 only."""
        host = self.external_host
        if not host:
            listen = self.web_listen if component in self.AUTH_COMPONENTS else "127.0.0.1"
            host = socket.gethostname() if listen in ("0.0.0.0", "::") else listen
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return f"{self.scheme(component)}://{host}:{port or self.ports[component]}"

    AUTH_COMPONENTS = (
        "prometheus",
        "alertmanager",
        "grafana",
    )  # the listeners web_client applies to

    def client(self, component):
        """The basic_auth (+ scheme/tls_config) block Prometheus sends to one of the stack's servers."""
        if component == "alertmanager" and self.alertmanager_auth:
            return self.alertmanager_auth[1]
        if self.web_client and component in self.AUTH_COMPONENTS:
            return self.web_client
        return (self.loopback_client if component in ("alertmanager", "prometheus") else None) or {}

    # -- configuration ---------------------------------------------------------------

    def prometheus_config(self):
        jobs = {
            "node": "node",
            "blockstack": "blockstack",
            "ebpf": "ebpf",
            "receiver": "receiver",
            "receiver-self": "receiver-self",
            "alertmanager": "alertmanager",
            "prometheus": "prometheus",
        }
        scrape_configs = []
        for component, job in jobs.items():
            if component in self.components and (component != "ebpf" or self.runs_ebpf):
                scrape_configs.append(
                    {
                        "job_name": job,
                        "scrape_interval": self.scrape_interval,
                        "static_configs": [
                            {
                                "targets": [f"{self.address(component)}:{self.ports[component]}"],
                                "labels": {"host": self.host},
                            }
                        ],
                        **self.client(component),
                    }
                )
        for job, (target, scheme) in self.also_scrape.items():
            tls = (
                {"tls_config": self.web_client["tls_config"]}
                if scheme == "https" and self.web_client
                else {}
            )
            scrape_configs.append(
                {
                    "job_name": job,
                    "scrape_interval": self.scrape_interval,
                    "scheme": scheme,
                    **tls,
                    "static_configs": [{"targets": [target], "labels": {"host": self.host}}],
                }
            )
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": self.rule_files,
            "scrape_configs": scrape_configs,
        }
        if "alertmanager" in self.components:
            config["alerting"] = {
                "alertmanagers": [
                    {
                        "static_configs": [
                            {
                                "targets": [
                                    f"{self.address('alertmanager')}:{self.ports['alertmanager']}"
                                ]
                            }
                        ],
                        **self.client("alertmanager"),
                    }
                ]
            }
        return config

    def alertmanager_config(self):
        """alerts/alertmanager.yml with its local webhook receivers pointed at our receivers' ports
        (LOCAL_WEBHOOKS), each sending the receiver's bearer token. A local webhook whose receiver
        the stack does not run (receiver-self in the lab and the central role) is left out: its
        alerts reach the page receiver through their page or ticket route already (`continue`),
        and a second copy there would be a second notification of one alert. Templates are named
        relative to alerts/; the paging knobs (self.paging) add e-mail and a chat or incident
        service to the `page` and `ticket` receivers."""
        alerts = os.path.join(REPO, "alerts")
        with open(os.path.join(alerts, "alertmanager.yml")) as f:
            config = yaml.safe_load(f)
        if "templates" in config:
            config["templates"] = [os.path.join(alerts, t) for t in config["templates"]]
        template = os.path.join(alerts, "templates", "blockstack.tmpl")
        if self.paging and template not in config.get("templates", []):
            # an alertmanager.yml kept from before the paging knobs (the package's conffile)
            config.setdefault("templates", []).append(template)
        for receiver in config.get("receivers", []):
            hooks = []
            for hook in receiver.get("webhook_configs", []):
                parts = urllib.parse.urlsplit(hook["url"])
                if parts.hostname in ("127.0.0.1", "localhost"):
                    component = LOCAL_WEBHOOKS.get(parts.port, "receiver")
                    if component not in self.components:
                        continue
                    hook["url"] = urllib.parse.urlunsplit(
                        parts._replace(netloc=f"127.0.0.1:{self.ports[component]}")
                    )
                    hook.setdefault("http_config", {})["authorization"] = {
                        "type": "Bearer",
                        "credentials_file": self.receiver_token_file,
                    }
                hooks.append(hook)
            if "webhook_configs" in receiver:
                receiver["webhook_configs"] = hooks
            if self.paging and receiver["name"] in paging.LEVELS:
                for key, configs in self.paging.integrations(receiver["name"], self.host).items():
                    receiver.setdefault(key, []).extend(configs)
        return config

    def render(self):
        os.makedirs(self.workdir, exist_ok=True)
        files = {"prometheus.yml": self.prometheus_config()}
        if {"receiver", "receiver-self"} & set(self.components):
            secret(self.receiver_token_file)
        if "alertmanager" in self.components:
            files["alertmanager.yml"] = self.alertmanager_config()
        for name, config in files.items():
            private = name == "alertmanager.yml" and self.paging.secret_in_config
            write_yaml(
                os.path.join(self.workdir, name), config, "blockstack_deploy/stack.py", private
            )
        if "grafana" in self.components:
            grafana.render(
                self.workdir,
                self.ports["grafana"],
                os.path.join(self.data_dir, "grafana"),
                self.url("prometheus"),
                self.grafana_password_file,
                scrape_interval=self.scrape_interval,
                root_url=self.external_url("grafana"),
                prometheus_url=self.external_url("prometheus"),
            )

    @property
    def grafana_password_file(self):
        return os.path.join(self.workdir, "grafana-admin-password")

    # -- processes -------------------------------------------------------------------

    def metrics_socket(self, component):
        return os.path.join(self.metrics_socket_dir, component, "metrics.sock")

    def _socketed(self, component, argv):
        """argv, started by metrics_front.py on its Unix socket when metrics_socket_dir is set."""
        if not self.metrics_socket_dir:
            return argv
        return [
            program("gate"),
            metrics_front.__file__,
            "exec",
            f"--socket={self.metrics_socket(component)}",
            "--",
            *argv,
        ]

    def commands(self):
        """{component: (argv, env, health_url)} in start order."""
        cmds = {}
        if "node" in self.components:
            cmds["node"] = self._node_command()
        if "blockstack" in self.components:
            cmds.update(self._blockstack_commands())
        if self.runs_ebpf:
            cmds["ebpf"] = self._ebpf_command()
        socketed = [c for c in ("node", "ebpf") if c in cmds]
        if self.metrics_socket_dir and socketed:
            cmds["front"] = self._front_command(socketed)
        if "receiver" in self.components:
            cmds["receiver"] = self._receiver_command()
        if "receiver-self" in self.components:
            cmds["receiver-self"] = self._receiver_self_command()
        if "alertmanager" in self.components:
            cmds["alertmanager"] = self._alertmanager_command()
        if "prometheus" in self.components:
            cmds["prometheus"] = self._prometheus_command()
        if "grafana" in self.components:  # optional: started only when listed (it needs Prometheus)
            binary, home = grafana.find() or (None, None)
            if binary is None:
                raise FileNotFoundError(grafana.HINT)
            cmds["grafana"] = grafana.command(
                binary, home, os.path.join(self.workdir, "grafana.ini"), self.ports["grafana"]
            )
        return cmds

    def _web_flags(self):
        """Prometheus's (and Alertmanager's, without a file of its own) --web.config.file."""
        if self.web_config_file:
            return [f"--web.config.file={self.web_config_file}"]
        if self.loopback_web_config:
            return [f"--web.config.file={self.loopback_web_config}"]
        return []

    def _node_command(self):
        listen = (
            ["--web.systemd-socket"]
            if self.metrics_socket_dir
            else [f"--web.listen-address=127.0.0.1:{self.ports['node']}"]
        )
        return (
            self._socketed(
                "node",
                [
                    program("node"),
                    *listen,
                    "--collector.disable-defaults",
                    "--collector.diskstats",
                    "--collector.cpu",
                    "--collector.meminfo",
                    "--collector.pressure",
                    f"--collector.diskstats.device-exclude={DISKSTATS_EXCLUDE}",
                ],
            ),
            {},
            self.url("node", "/metrics"),
        )

    def _blockstack_commands(self):
        """blockstack-exporter and, where it has a socket, its dm helper."""
        if "ebpf" in self.components:
            _ = self.ebpf_configs  # the probe writes the status file
        status = (
            [f"--collector.ebpf.status-file={self.ebpf_status_file}"]
            if self.ebpf_status_file and os.path.exists(self.ebpf_status_file)
            else []
        )
        helper = [f"--collector.dm.helper={self.dm_helper_socket}"] if self.dm_helper_socket else []
        cmds = {
            "blockstack": (
                [
                    program("blockstack"),
                    f"--web.listen-address=127.0.0.1:{self.ports['blockstack']}",
                    *status,
                    *helper,
                ],
                {},
                self.url("blockstack", "/metrics"),
            )
        }
        if (
            helper
        ):  # its health shows in the exporter's dm collector (blockstack_scrape_collector_success)
            cmds["dm"] = (
                [
                    program("gate"),
                    "-I",
                    "-m",
                    "blockstack_exporter.dm_helper",
                    f"--socket={self.dm_helper_socket}",
                ],
                {},
                self.url("blockstack", "/metrics"),
            )
        return cmds

    def _ebpf_command(self):
        # --capabilities.keep: every capability dropped once the programs are attached (but
        # CAP_BPF before 5.19, ebpf_keep_capabilities)
        listen = "fd://0" if self.metrics_socket_dir else f"127.0.0.1:{self.ports['ebpf']}"
        return (
            self._socketed(
                "ebpf",
                [
                    program("ebpf"),
                    f"--config.dir={EBPF_CONFIG_DIR}",
                    f"--config.names={self.ebpf_configs}",
                    *_btf_path(),
                    f"--capabilities.keep={ebpf_keep_capabilities(self.kernel_release)}",
                    f"--web.listen-address={listen}",
                ],
            ),
            {"OTEL_TRACES_EXPORTER": "none"},
            self.url("ebpf", "/metrics"),
        )

    def _front_command(self, socketed):
        """metrics_front.py answering /metrics on the ports of the `socketed` exporters."""
        return (
            [
                program("gate"),
                metrics_front.__file__,
                "serve",
                *(f"--route=127.0.0.1:{self.ports[c]}={self.metrics_socket(c)}" for c in socketed),
            ],
            {},
            self.url(socketed[-1], "/metrics"),
        )

    def _receiver_command(self):
        return (
            [
                program("receiver"),
                os.path.join(REPO, "alerts", "receiver", "page_receiver.py"),
                f"--listen=127.0.0.1:{self.ports['receiver']}",
                f"--file={self.pages_file}",
                f"--token-file={self.receiver_token_file}",
                f"--statfs={self.data_dir}",
                *(
                    [f"--heartbeat-url-file={self.heartbeat_url_file}"]
                    if self.heartbeat_url_file and os.path.exists(self.heartbeat_url_file)
                    else []
                ),
            ],
            {},
            self.url("receiver", "/healthz"),
        )

    def _receiver_self_command(self):
        """The second notifier's receiver: small, a few notifications a day, on /run."""
        return (
            [
                program("receiver-self"),
                os.path.join(REPO, "alerts", "receiver", "page_receiver.py"),
                f"--listen=127.0.0.1:{self.ports['receiver-self']}",
                f"--file={self.self_pages_file}",
                f"--token-file={self.receiver_token_file}",
                "--path=/page",
                f"--max-bytes={4 << 20}",
                "--backups=1",
            ],
            {},
            self.url("receiver-self", "/healthz"),
        )

    def _alertmanager_command(self):
        return (
            [
                program("alertmanager", self.servers),
                f"--config.file={self.workdir}/alertmanager.yml",
                f"--storage.path={self.data_dir}/alertmanager",
                f"--web.listen-address={self.web_listen}:{self.ports['alertmanager']}",
                f"--web.external-url={self.external_url('alertmanager')}",
                "--cluster.listen-address=",
                *(
                    [f"--web.config.file={self.alertmanager_auth[0]}"]
                    if self.alertmanager_auth
                    else self._web_flags()
                ),
            ],
            {},
            self.url("alertmanager", "/-/ready"),
        )

    def _prometheus_command(self):
        return (
            [
                program("prometheus", self.servers),
                f"--config.file={self.workdir}/prometheus.yml",
                f"--storage.tsdb.path={self.data_dir}/prometheus",
                f"--storage.tsdb.retention.time={RETENTION}",
                f"--storage.tsdb.retention.size={RETENTION_SIZE}",
                f"--web.listen-address={self.web_listen}:{self.ports['prometheus']}",
                f"--web.external-url={self.external_url('prometheus')}",
                f"--web.user-assets={DOCS_HTML}",  # the runbook: <external URL>/user/runbook.html
                f"--web.cors.origin={CORS_ORIGIN}",
                # Alertmanager keeps an alert 4 resend delays after its last send (the
                # default 1m: a dead Prometheus's watchdog lived on 4 min before the
                # dead man's switch could miss it); 15 s: 1 min, for one POST per 15 s
                f"--rules.alert.resend-delay={RESEND_DELAY}",
                *self._web_flags(),
            ],
            # no --web.enable-lifecycle: any local user could POST /-/quit; reload is SIGHUP
            {},
            self.url("prometheus", "/-/ready"),
        )

    @contextlib.contextmanager
    def running(self, timeout=90):
        """Render and start every component, each logging to workdir/NAME.log; stop all on exit."""
        self.render()
        with contextlib.ExitStack() as stack:
            for name, (argv, env, health) in self.commands().items():
                stack.enter_context(
                    procs.running(
                        argv,
                        env=env,
                        health_url=health,
                        timeout=timeout,
                        log_path=os.path.join(self.workdir, f"{name}.log"),
                    )
                )
            yield self
