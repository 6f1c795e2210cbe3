"""What every role shares: the Role interface, the fleet roles' common part, the health probe."""

import base64
import os
import ssl
import urllib.error
import urllib.request

from blockstack_exporter.collectors.ebpf import parse_status

from .. import grafana, privileges
from ..stack import BUILD, which

THANOS = os.path.join(BUILD, "bin", "thanos")
GRAFANA_HINT = grafana.HINT + "; everything else runs, and `make up` picks Grafana up next time."


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
    # (program, directory) of its socket: only the front (the dm helper's: the exporter) may enter
    sockets = ()

    def __init__(self, state, ports=None, listen="127.0.0.1", grafana_server=None):
        """grafana_server: (binary, home) of the Grafana that runs with the role
        (grafana.find())."""
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
    """What the agent and the central side share: the fleet's secrets (fleet_auth.py), its
    summary."""

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
