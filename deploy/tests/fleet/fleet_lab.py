"""A small fleet on one machine: N simulated hosts (network namespaces on a private bridge), each
with its own loop-device lab and an agent role, and the central role in the root namespace.

    host hI (namespace, 10.200.K.(10+I)):
        upper loopU (direct-io) -> file on ext4 -> lower loopL    (lineup series: a stacked pair)
        plain loop devices p1, p2, ...                             (merge collapses to page on)
        node/blockstack/ebpf exporters + Prometheus replica(s) + Thanos sidecar(s)   (agent role)
    root namespace (10.200.K.1 on the bridge, and 127.0.0.1):
        page receiver, 2 Alertmanager peers (cluster) behind 2 alert gates, watcher Prometheus,
        Thanos Query (central); each host's secrets directory is the central's hosts/HOST/
        (fleet_auth.py: its certificate, its own push secret, the scrape user's hash)

All hosts share one kernel, so every exporter sees every loop device: each agent keeps only its
own devices (Agent(devices=...)). Agent processes enter only the host's network namespace
(nsenter --net), so they keep the root's /sys and tracefs (ebpf_exporter needs them).
Everything is undone on exit, also on failure: processes, namespaces, bridge, mounts, loops.
"""

import contextlib
import os
import shutil
import subprocess
import types

import netns

from blockstack_deploy.fleet_auth import CentralSecrets
from blockstack_deploy.roles import Agent, Central, probe, write_inventory
from blockstack_deploy.stack import ebpf_config_names
from blockstack_lab import loop
from blockstack_testsupport import procs
from blockstack_testsupport.procs import wait_until

LOWER_SIZE = 128 << 20
UPPER_SIZE = 64 << 20
PLAIN_SIZE = 64 << 20


class Host:
    def __init__(self, name, ns, address):
        self.name, self.ns, self.address = name, ns, address
        self.procs = {}  # component -> Popen
        self.upper = self.lower = None
        self.plain = []  # '/dev/loopN' of the plain devices


@contextlib.contextmanager
def fleet_lab(
    workdir,
    hosts=("h1", "h2", "h3"),
    replicas=None,
    plain_devices=None,
    host_down_for="15s",
    scrape_interval="5s",
    log=print,
):
    """Yields a namespace: central (Central), hosts {name: Host}, agents {name: Agent}, secrets
    (the central's), admin and scrape (user, password), inventory path, start(host, component) /
    kill(host, component)."""
    replicas = replicas or {}
    plain_devices = plain_devices or {}
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    with contextlib.ExitStack() as es:
        central_addr, nets = es.enter_context(netns.bridged_hosts(hosts))
        log(
            f">> fleet: central {central_addr}, "
            f"hosts {', '.join(f'{h}={a}' for h, (_, a) in nets.items())}"
        )
        secrets = CentralSecrets(os.path.join(workdir, "secrets")).ensure(
            server_names={"central": [central_addr, "127.0.0.1"]}, client_names=["query"]
        )
        host_secrets = {
            h: secrets.issue(h, a) for h, (_, a) in nets.items()
        }  # what `stackctl.py fleet-cert` makes
        admin, scrape = (
            (secrets.user, secrets.password()),
            (secrets.scrape.user, secrets.scrape.password()),
        )
        fleet_hosts = host_labs(es, nets, plain_devices, log)
        inventory = os.path.join(workdir, "inventory.yml")
        central, central_procs = start_central(
            es, workdir, inventory, secrets, central_addr, scrape_interval, host_down_for, admin
        )
        agents, starters = render_agents(
            workdir, fleet_hosts, central, host_secrets, replicas, scrape_interval
        )
        agent_procs = AgentProcs(fleet_hosts, starters, secrets)
        es.callback(agent_procs.stop_all)
        for key in starters:
            agent_procs.start(*key)
        for key in starters:
            agent_procs.wait_ready(*key)
        write_inventory(
            inventory,
            [e for h, a in agents.items() for e in a.inventory_entries(fleet_hosts[h].address)],
        )
        log(f">> fleet: {len(starters)} agent processes up; inventory {inventory}")
        yield types.SimpleNamespace(
            central=central,
            central_procs=central_procs,
            hosts=fleet_hosts,
            agents=agents,
            secrets=secrets,
            admin=admin,
            scrape=scrape,
            inventory=inventory,
            start=agent_procs.start,
            kill=agent_procs.kill,
            wait_ready=agent_procs.wait_ready,
            central_address=central_addr,
        )


def host_labs(es, nets, plain_devices, log):
    """Each host's loop-device lab, undone by es: {name: Host}."""
    fleet_hosts = {}
    for h, (ns, addr) in nets.items():
        host = fleet_hosts[h] = Host(h, ns, addr)
        lower, upper, _ = es.enter_context(
            loop.stacked_pair(LOWER_SIZE, UPPER_SIZE, directory="/dev/shm")
        )
        host.upper, host.lower = loop.name(upper), loop.name(lower)
        for _ in range(plain_devices.get(h, 0)):
            dev = es.enter_context(loop.attached(PLAIN_SIZE, directory="/dev/shm"))
            subprocess.run(
                [
                    "fio",
                    "--name=fill",
                    f"--filename={dev}",
                    f"--size={PLAIN_SIZE}",
                    "--rw=write",
                    "--bs=1m",
                    "--direct=1",
                    "--output=/dev/null",
                ],
                check=True,
                timeout=120,
            )
            host.plain.append(dev)
        log(f">> fleet: {h}: {host.upper} on a file on ext4 on {host.lower}; plain {host.plain}")
    return fleet_hosts


def start_central(
    es, workdir, inventory, secrets, central_addr, scrape_interval, host_down_for, admin
):
    """The central role in the root namespace, every program answering: (Central, {name: Popen})."""
    cports = {
        name: procs.free_port()
        for name in (
            "receiver",
            "query-http",
            "query-grpc",
            "watcher-A",
            "alertmanager-1",
            "alertmanager-1-cluster",
            "alertmanager-2",
            "alertmanager-2-cluster",
            "gate-1",
            "gate-2",
        )
    }
    central = Central(
        os.path.join(workdir, "central"),
        inventory,
        secrets,
        listen=central_addr,
        ports=cports,
        scrape_interval=scrape_interval,
        host_down_for=host_down_for,
    )
    central.render()
    central_procs = {}
    for name, (argv, env, _health) in central.commands().items():
        central_procs[name] = es.enter_context(
            procs.running(argv, env=env, log_path=os.path.join(central.config, f"{name}.log"))
        )
    for name, (_argv, _env, health) in central.commands().items():
        wait_until(
            f"central {name} ({health})",
            lambda: _alive(central_procs[name], name) and probe(health, auth=admin, ca=secrets.ca),
            60,
        )
    return central, central_procs


def render_agents(workdir, fleet_hosts, central, host_secrets, replicas, scrape_interval):
    """The agent role of each host, rendered: ({name: Agent}, {(host, program): (argv in the
    host's namespace, env, health URL, log)})."""
    # one probe for the hosts, which share this kernel; each agent's exporter reads its status
    ebpf_status = os.path.join(workdir, "ebpf-status.tsv")
    ebpf_configs = ebpf_config_names(status_file=ebpf_status)
    agents = {}
    starters = {}
    for h, host in fleet_hosts.items():
        devices = "|".join([host.upper, host.lower] + [loop.name(d) for d in host.plain])
        agent = agents[h] = Agent(
            os.path.join(workdir, h),
            h,
            central.alertmanager_addresses(),
            host_secrets[h],
            replicas=replicas.get(h, ("A",)),
            listen=host.address,
            devices=devices,
            scrape_interval=scrape_interval,
            ebpf_configs=ebpf_configs,
        )
        os.makedirs(os.path.dirname(agent.exporters.ebpf_status_file), exist_ok=True)
        shutil.copy(ebpf_status, agent.exporters.ebpf_status_file)
        agent.render()
        for name, (argv, env, health) in agent.commands().items():
            starters[(h, name)] = (
                netns.argv_in_net(host.ns, argv),
                env,
                health,
                os.path.join(agent.config, f"{name}.log"),
            )
    return agents, starters


class AgentProcs:
    """The agents' programs, each started, awaited and killed on its own (host, program)."""

    def __init__(self, fleet_hosts, starters, secrets):
        self.fleet_hosts, self.starters, self.secrets = fleet_hosts, starters, secrets
        self.ctx = {}

    def start(self, h, name):
        argv, env, health, log_path = self.starters[(h, name)]
        cm = procs.running(argv, env=env, log_path=log_path)
        proc = cm.__enter__()
        self.ctx[(h, name)] = cm
        self.fleet_hosts[h].procs[name] = proc
        return proc

    def wait_ready(self, h, name, timeout=90):
        health = self.starters[(h, name)][2]
        proc = self.fleet_hosts[h].procs[name]
        wait_until(
            f"{h} {name} ({health})",
            lambda: (
                _alive(proc, f"{h} {name}")
                and netns.call_in(self.fleet_hosts[h].ns, probe, health, None, self.secrets.ca)
            ),
            timeout,
        )  # 2xx, or 401: up

    def kill(self, h, name):
        cm = self.ctx.pop((h, name))
        proc = self.fleet_hosts[h].procs.pop(name)
        os.killpg(proc.pid, 9)
        proc.wait(30)
        cm.__exit__(None, None, None)

    def stop_all(self):
        for key in list(self.ctx):
            with contextlib.suppress(Exception):
                self.kill(*key)


def _alive(proc, name):
    if proc.poll() is not None:
        raise RuntimeError(f"{name} exited with {proc.returncode} (see its log)")
    return True
