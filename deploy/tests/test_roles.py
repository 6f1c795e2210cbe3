"""The fleet roles' rendered configuration, checked by the engines' own tools (no root, seconds):
promtool for the agent and watcher Prometheus configs, amtool for the Alertmanager config, and
the properties paging depends on (replica dropped from alerts, host on every series, TLS + basic
auth beyond loopback). The fleet rules' own unit tests are alerts/tests/fleet.test.yml's."""
import subprocess

import pytest
import yaml

from blockstack_deploy import pki, roles, stack


def tool(name, servers):
    """promtool or amtool of one set of servers (stack.SERVERS: Debian's, and Prometheus 3's)."""
    try:
        return stack.program(name, servers)
    except FileNotFoundError as e:
        pytest.fail(str(e))


servers_matrix = pytest.mark.parametrize("servers", list(stack.SERVERS))


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    s = pki.Secrets(tmp_path_factory.mktemp("secrets"))
    return s.ensure(server_names={"central": ["10.9.0.1"], "db1": ["10.9.0.11"]}, client_names=["query"])


@pytest.mark.built  # the agent's commands name ebpf_exporter and the Thanos sidecar
@servers_matrix
def test_agent_config(tmp_path, secrets, servers):
    agent = roles.Agent(tmp_path, "db1", ["10.9.0.1:9093", "10.9.0.1:9095"], secrets, replicas=("A", "B"),
                        listen="10.9.0.11", ebpf_configs="block_sizes")
    agent.render()
    for r in ("A", "B"):
        path = tmp_path / "config" / f"prometheus-{r}.yml"
        subprocess.run([tool("promtool", servers), "check", "config", str(path)], check=True, capture_output=True, timeout=60)
        config = yaml.safe_load(path.read_text())
        assert config["global"]["external_labels"] == {"host": "db1", "replica": r}
        assert {"action": "labeldrop", "regex": "replica"} in config["alerting"]["alert_relabel_configs"]
        am = config["alerting"]["alertmanagers"][0]
        assert am["scheme"] == "https" and am["basic_auth"]["username"] == "fleet"
        assert am["static_configs"][0]["targets"] == ["10.9.0.1:9093", "10.9.0.1:9095"]
        assert all(sc["static_configs"][0]["labels"]["host"] == "db1" for sc in config["scrape_configs"])
    cmds = agent.commands()
    assert {"node", "blockstack", "ebpf", "prometheus-A", "prometheus-B", "sidecar-A", "sidecar-B"} == set(cmds)
    for name, (argv, _, _) in cmds.items():
        # POST /-/quit would exit 0, which Restart=on-failure does not restart: no lifecycle API
        assert "--web.enable-lifecycle" not in argv, name
        listens = [a for a in argv if "listen-address=" in a or "-address=" in a]
        beyond = [a for a in listens if "127.0.0.1" not in a]
        if beyond:  # only the sidecars, and only with TLS + auth
            assert name.startswith("sidecar-"), (name, beyond)
            assert any(a.startswith("--grpc-server-tls-client-ca=") for a in argv)
            assert any(a.startswith("--http.config=") for a in argv)
    web = yaml.safe_load((tmp_path / "config" / "web-config.yml").read_text())
    assert "fleet" in web["basic_auth_users"] and web["tls_server_config"]["cert_file"].endswith("db1.crt")
    assert agent.inventory_entries()[1] == {"targets": ["10.9.0.11:10911"], "labels": {
        "host": "db1", "replica": "B", "__http_address__": "10.9.0.11:10912"}}


@pytest.mark.built  # Thanos Query
@servers_matrix
def test_central_config(tmp_path, secrets, servers):
    inventory = tmp_path / "inventory.yml"
    central = roles.Central(tmp_path / "central", str(inventory), secrets, listen="10.9.0.1")
    central.render()
    roles.write_inventory(str(inventory), roles.Agent(tmp_path / "a", "db1", ["10.9.0.1:9093"], secrets,
                                                      listen="10.9.0.11").inventory_entries())
    subprocess.run([tool("promtool", servers), "check", "config", str(tmp_path / "central" / "config" / "watcher-A.yml")], check=True,
                   capture_output=True, timeout=60)
    subprocess.run([tool("amtool", servers), "check-config", str(tmp_path / "central" / "config" / "alertmanager.yml")], check=True,
                   capture_output=True, timeout=60)
    cmds = central.commands()
    assert {"receiver", "alertmanager-1", "alertmanager-2", "watcher-A", "query"} == set(cmds)
    am1 = cmds["alertmanager-1"][0]
    assert "--cluster.peer=127.0.0.1:9096" in am1 and any(a.startswith("--web.config.file=") for a in am1)
    query = cmds["query"][0]
    assert "--query.replica-label=replica" in query and f"--store.sd-files={inventory}" in query
    assert "--grpc-client-tls-secure" in query
    assert any(a.startswith("--http-address=127.0.0.1:") for a in query)
    assert not [name for name, (argv, _, _) in cmds.items() if "--web.enable-lifecycle" in argv]
    # the receiver takes only notifications with its token, which Alertmanager's webhooks send
    am_config = yaml.safe_load((tmp_path / "central" / "config" / "alertmanager.yml").read_text())
    hooks = [h for r in am_config["receivers"] for h in r.get("webhook_configs", [])]
    token = central.receiver_stack.receiver_token_file
    assert hooks and all(h["http_config"]["authorization"]["credentials_file"] == token for h in hooks)
    assert f"--token-file={token}" in cmds["receiver"][0]
