"""The three ways to run the stack on a host, behind one interface (base.Role), one module each:

standalone.py  `make up`: the single-host stack, Grafana, all on 127.0.0.1 (TLS + basic auth
               with --listen ADDR or --auth)
agent.py       `make up-agent`, on every monitored host: the exporters, Prometheus replicas that
               evaluate the rules and push alerts to the central gates, a Thanos sidecar each
central.py     `make up-central`: the page receiver, the Alertmanager cluster behind alert gates,
               Thanos Query, the watcher Prometheus, Grafana
"""

import os
import shutil

from .. import fleet_auth, grafana
from ..stack import COMPONENTS, Stack
from .agent import Agent
from .base import (
    GRAFANA_HINT,
    THANOS,
    FleetRole,
    Role,
    ebpf_summary,
    loopback,
    probe,
    self_pages_dir,
    thanos,
)
from .central import Central, write_inventory
from .standalone import Standalone

__all__ = [
    "GRAFANA_HINT",
    "ROLES",
    "THANOS",
    "Agent",
    "Central",
    "FleetRole",
    "Role",
    "Standalone",
    "ebpf_summary",
    "loopback",
    "make",
    "missing",
    "probe",
    "self_pages_dir",
    "thanos",
    "write_inventory",
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
    external_host=None,
):
    """The role `name` on state, from the options of `stackctl.py up` (docs/fleet.md)."""
    if name == "standalone":
        return Standalone(
            state,
            ports,
            listen,
            auth=auth,
            tls=tls,
            grafana_server=grafana.find(),
            external_host=external_host,
        )
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


def missing():
    """What the fleet roles need and cannot find here, each naming its make target."""
    problems = Stack(os.devnull, components=COMPONENTS).missing()
    if not os.access(THANOS, os.X_OK):
        problems.append(f"{THANOS} not found (run make thanos)")
    for tool in ("ip", "losetup", "fio", "openssl"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found (run make deps)")
    return problems
