"""The fleet roles' rendered configuration, checked by the engines' own tools (no root, seconds):
promtool for the agent and watcher Prometheus configs, amtool for the Alertmanager config, and
the properties paging depends on (replica dropped from alerts, host on every series, TLS + basic
auth beyond loopback). The fleet rules' own unit tests are alerts/tests/fleet.test.yml's."""

import os
import subprocess

import pytest
import yaml

from blockstack_deploy import fleet_auth, roles, stack


def tool(name, servers):
    """promtool or amtool of one set of servers (stack.SERVERS: Debian's, and Prometheus 3's)."""
    try:
        return stack.program(name, servers)
    except FileNotFoundError as e:
        pytest.fail(str(e))


servers_matrix = pytest.mark.parametrize("servers", list(stack.SERVERS))


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    """The central's fleet credentials (fleet_auth.CentralSecrets) with db1 issued."""
    s = fleet_auth.CentralSecrets(tmp_path_factory.mktemp("secrets"))
    s.ensure(server_names={"central": ["10.9.0.1"]}, client_names=["query"]).issue(
        "db1", "10.9.0.11"
    )
    return s


def db1(secrets):
    return fleet_auth.HostSecrets(secrets.host_dir("db1"), "db1")


@pytest.mark.built  # the agent's commands name ebpf_exporter and the Thanos sidecar
@pytest.mark.long
@servers_matrix
def test_agent_config(tmp_path, secrets, servers):
    agent = roles.Agent(
        tmp_path,
        "db1",
        ["10.9.0.1:9093", "10.9.0.1:9095"],
        db1(secrets),
        replicas=("A", "B"),
        listen="10.9.0.11",
        ebpf_configs="block_sizes",
    )
    agent.render()
    for r in ("A", "B"):
        path = tmp_path / "config" / f"prometheus-{r}.yml"
        subprocess.run(
            [tool("promtool", servers), "check", "config", str(path)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        config = yaml.safe_load(path.read_text())
        assert config["global"]["external_labels"] == {"host": "db1", "replica": r}
        assert {"action": "labeldrop", "regex": "replica"} in config["alerting"][
            "alert_relabel_configs"
        ]
        am = config["alerting"]["alertmanagers"][0]
        # the host's own push secret, nothing shared with other hosts or the central side
        assert am["scheme"] == "https" and am["basic_auth"] == {
            "username": "db1",
            "password_file": db1(secrets).push_password_file,
        }
        assert am["static_configs"][0]["targets"] == ["10.9.0.1:9093", "10.9.0.1:9095"]
        assert all(
            sc["static_configs"][0]["labels"]["host"] == "db1" for sc in config["scrape_configs"]
        )
    cmds = agent.commands()
    assert {
        "node",
        "blockstack",
        "ebpf",
        "front",
        "prometheus-A",
        "prometheus-B",
        "sidecar-A",
        "sidecar-B",
    } == set(cmds)
    for name, (argv, _, _) in cmds.items():
        # POST /-/quit would exit 0, which Restart=on-failure does not restart: no lifecycle API
        assert "--web.enable-lifecycle" not in argv, name
        listens = [a for a in argv if "listen-address=" in a or "-address=" in a]
        beyond = [
            a for a in listens if "127.0.0.1" not in a and not a.endswith("=fd://0")
        ]  # fd 0: a Unix socket
        if beyond:  # only the sidecars, and only with TLS + auth
            assert name.startswith("sidecar-"), (name, beyond)
            assert any(a.startswith("--grpc-server-tls-client-ca=") for a in argv)
            assert any(a.startswith("--http.config=") for a in argv)
    web = yaml.safe_load((tmp_path / "config" / "web-config.yml").read_text())
    # the sidecars take the central's scrape user only; the host holds its hash, not the password
    assert list(web["basic_auth_users"]) == ["scrape"] and web["tls_server_config"][
        "cert_file"
    ].endswith("db1.crt")
    # Go's /debug/pprof/: node_exporter and ebpf_exporter on sockets behind metrics_front.py, the
    # replicas behind this host's own admin password, which their sidecars send
    assert (
        "--web.systemd-socket" in cmds["node"][0]
        and "--web.listen-address=fd://0" in cmds["ebpf"][0]
    )
    assert [a for a in cmds["front"][0] if a.startswith("--route=")] == [
        f"--route=127.0.0.1:9100={tmp_path}/run/node/metrics.sock",
        f"--route=127.0.0.1:9435={tmp_path}/run/ebpf/metrics.sock",
    ]
    prom_web = yaml.safe_load((tmp_path / "config" / "prometheus-web.yml").read_text())
    assert list(prom_web["basic_auth_users"]) == ["admin"] and "tls_server_config" not in prom_web
    assert f"--web.config.file={tmp_path}/config/prometheus-web.yml" in cmds["prometheus-A"][0]
    client = yaml.safe_load((tmp_path / "config" / "prometheus-client.yml").read_text())
    assert client["basic_auth"] == {
        "username": "admin",
        "password_file": f"{tmp_path}/secrets/admin-password",
    }
    assert (
        f"--prometheus.http-client-file={tmp_path}/config/prometheus-client.yml"
        in cmds["sidecar-B"][0]
    )
    assert sorted(os.listdir(db1(secrets).dir)) == [
        "ca.crt",
        "db1.crt",
        "db1.key",
        "push-password",
        "scrape-password.bcrypt",
    ]
    assert agent.inventory_entries()[1] == {
        "targets": ["10.9.0.11:10911"],
        "labels": {"host": "db1", "replica": "B", "__http_address__": "10.9.0.11:10912"},
    }


@pytest.mark.built  # Thanos Query
@pytest.mark.long
@servers_matrix
def test_central_config(tmp_path, secrets, servers):
    inventory = tmp_path / "inventory.yml"
    central = roles.Central(tmp_path / "central", str(inventory), secrets, listen="10.9.0.1")
    central.render()
    roles.write_inventory(
        str(inventory),
        roles.Agent(
            tmp_path / "a", "db1", ["10.9.0.1:9093"], db1(secrets), listen="10.9.0.11"
        ).inventory_entries(),
    )
    subprocess.run(
        [
            tool("promtool", servers),
            "check",
            "config",
            str(tmp_path / "central" / "config" / "watcher-A.yml"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        [
            tool("amtool", servers),
            "check-config",
            str(tmp_path / "central" / "config" / "alertmanager.yml"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    cmds = central.commands()
    assert {
        "receiver",
        "alertmanager-1",
        "alertmanager-2",
        "gate-1",
        "gate-2",
        "watcher-A",
        "query",
    } == set(cmds)
    am1 = cmds["alertmanager-1"][0]
    assert "--cluster.peer=127.0.0.1:9096" in am1 and "--web.listen-address=127.0.0.1:9193" in am1
    # the peers: loopback, the admin password only; agents reach the gates, over TLS
    am_web = yaml.safe_load((tmp_path / "central" / "config" / "admin-web.yml").read_text())
    assert f"--web.config.file={tmp_path / 'central' / 'config' / 'admin-web.yml'}" in am1
    assert list(am_web["basic_auth_users"]) == ["admin"] and "tls_server_config" not in am_web
    assert central.alertmanager_addresses() == ["10.9.0.1:9093", "10.9.0.1:9095"]
    gate = cmds["gate-1"][0]
    assert "--listen=10.9.0.1:9093" in gate and "--alertmanager=http://127.0.0.1:9193" in gate
    assert any(a.startswith("--tls-cert=") for a in gate)
    watcher = yaml.safe_load((tmp_path / "central" / "config" / "watcher-A.yml").read_text())
    assert watcher["scrape_configs"][0]["basic_auth"]["username"] == "scrape"
    assert watcher["alerting"]["alertmanagers"][0]["basic_auth"]["username"] == "admin"
    assert watcher["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "127.0.0.1:9193",
        "127.0.0.1:9195",
    ]
    query = cmds["query"][0]
    assert "--query.replica-label=replica" in query and f"--store.sd-files={inventory}" in query
    assert "--grpc-client-tls-secure" in query
    assert any(a.startswith("--http-address=127.0.0.1:") for a in query)
    # the watcher and Thanos Query (and their /debug/pprof/) behind the admin password, as the peers
    assert f"--http.config={tmp_path / 'central' / 'config' / 'admin-web.yml'}" in query
    assert (
        f"--web.config.file={tmp_path / 'central' / 'config' / 'admin-web.yml'}"
        in cmds["watcher-A"][0]
    )
    assert not [name for name, (argv, _, _) in cmds.items() if "--web.enable-lifecycle" in argv]
    # the receiver takes only notifications with its token, which Alertmanager's webhooks send
    am_config = yaml.safe_load((tmp_path / "central" / "config" / "alertmanager.yml").read_text())
    hooks = [h for r in am_config["receivers"] for h in r.get("webhook_configs", [])]
    token = central.receiver_stack.receiver_token_file
    assert hooks and all(
        h["http_config"]["authorization"]["credentials_file"] == token for h in hooks
    )
    assert f"--token-file={token}" in cmds["receiver"][0]
