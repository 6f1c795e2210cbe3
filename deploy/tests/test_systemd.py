"""The systemd units of every role, rendered from the commands the roles hand to supervisord and
checked by `systemd-analyze verify` (Debian's systemd package; systemd need not be PID 1): unknown
settings, bad escapes and ExecStart paths that are not executable here all fail."""

import re
import shutil
import subprocess

import pytest

from blockstack_deploy import fleet_auth, grafana, privileges, roles, systemd

# the units' ExecStart: ebpf_exporter and Thanos must exist (make test-long builds Thanos)
pytestmark = [pytest.mark.built, pytest.mark.long]


def verify(directory, units):
    """systemd-analyze's complaints about the units written into directory ('' when none)."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze not found (run make deps: Debian package systemd)")
    for name, text in units.items():
        (directory / name).write_text(text)
    r = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(directory / n) for n in units)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return (r.stdout + r.stderr).strip() if r.returncode or r.stderr.strip() else ""


def role_units(role):
    try:
        return systemd.units(role)
    except FileNotFoundError as e:  # a program not built or installed here
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    s = fleet_auth.CentralSecrets(tmp_path_factory.mktemp("secrets"))
    s.ensure(server_names={"central": ["10.9.0.1"]}, client_names=["query"]).issue(
        "db1", "10.9.0.11"
    )
    return s


def test_standalone_units(tmp_path):
    role = roles.Standalone(
        tmp_path / "state",
        listen="0.0.0.0",
        ebpf_configs="block_sizes,missed_merges",
        grafana_server=grafana.find(),
    )
    units = role_units(role)
    assert set(units) >= {
        "blockstack-node-exporter.service",
        "blockstack-exporter.service",
        "blockstack-ebpf-exporter.service",
        "blockstack-page-receiver.service",
        "blockstack-alertmanager.service",
        "blockstack-prometheus.service",
    }
    prometheus = units["blockstack-prometheus.service"]
    assert "ExecReload=/bin/kill -HUP $MAINPID" in prometheus and "--web.config.file=" in prometheus
    assert "--web.listen-address=0.0.0.0:9090" in prometheus
    node = units["blockstack-node-exporter.service"]
    assert (
        r"--collector.diskstats.device-exclude=^(ram|fd|sr)\\d+$$" in node
    )  # the regex, escaped for systemd
    assert_fronted(units)
    assert verify(tmp_path, units) == ""


def assert_fronted(units):
    """The exporters with a /debug/pprof/ serve /metrics on a socket systemd makes (only the
    front's group may connect); the front answers their ports."""
    for exporter in ("node-exporter", "ebpf-exporter"):
        assert "SocketGroup=blockstack-front" in units[f"blockstack-{exporter}.socket"]
        assert f"Requires=blockstack-{exporter}.socket" in units[f"blockstack-{exporter}.service"]
    node = units["blockstack-node-exporter.service"]
    assert "--web.systemd-socket" in node and "metrics_front.py" not in node
    assert "User=blockstack-front" in units["blockstack-front.service"]


def test_agent_units(tmp_path, secrets):
    role = roles.Agent(
        tmp_path / "state",
        "db1",
        ["10.9.0.1:9093"],
        fleet_auth.HostSecrets(secrets.host_dir("db1"), "db1"),
        replicas=("A", "B"),
        listen="10.9.0.11",
        ebpf_configs="block_sizes",
    )
    units = role_units(role)
    assert {"blockstack-prometheus-A.service", "blockstack-sidecar-B.service"} <= set(units)
    assert "--grpc-server-tls-client-ca=" in units["blockstack-sidecar-A.service"]
    # /debug/pprof/: the exporters fronted, the replicas behind the host's own password, which the sidecars send
    assert_fronted(units)
    assert "--web.config.file=" in units["blockstack-prometheus-B.service"]
    assert "--prometheus.http-client-file=" in units["blockstack-sidecar-B.service"]
    assert verify(tmp_path, units) == ""


def test_central_units(tmp_path, secrets):
    role = roles.Central(
        tmp_path / "state", str(tmp_path / "inventory.yml"), secrets, listen="10.9.0.1"
    )
    units = role_units(role)
    assert {
        "blockstack-alertmanager-1.service",
        "blockstack-gate-1.service",
        "blockstack-watcher-A.service",
        "blockstack-query.service",
    } <= set(units)
    assert "User=blockstack-gate" in units["blockstack-gate-1.service"]
    # /debug/pprof/ of the watcher and Thanos Query behind the admin password, as the peers'
    assert "--web.config.file=" in units["blockstack-watcher-A.service"]
    assert "--http.config=" in units["blockstack-query.service"]
    assert verify(tmp_path, units) == ""


def test_verify_catches_what_the_hand_written_units_had(tmp_path):
    """The node_exporter unit written by hand had the regex's `\\d` unescaped (systemd: "Ignoring
    unknown escape sequences"), and a unit naming a program not installed cannot start."""
    role = roles.Standalone(tmp_path / "state", ebpf_configs="block_sizes")
    node = role_units(role)["blockstack-node-exporter.service"]
    assert "Ignoring unknown escape sequences" in verify(
        tmp_path, {"blockstack-a.service": node.replace(r"\\d", r"\d")}
    )
    missing = re.sub(r"ExecStart=\S+", "ExecStart=/nonexistent/node_exporter", node)
    assert "is not executable" in verify(tmp_path, {"blockstack-b.service": missing})


def test_device_mapper_only_the_helper_holds_a_capability(tmp_path, monkeypatch):
    """Where the kernel has device-mapper the dm helper's unit is the only one with CAP_SYS_ADMIN (on
    no network); blockstack-exporter asks it over its socket and holds no capability; no unit runs
    as root; every unit writes under umask 027 (privileges.py)."""
    monkeypatch.setattr(privileges, "device_mapper", lambda: True)  # this host's kernel has none
    role = roles.Standalone(tmp_path / "state", ebpf_configs="block_io")
    units = role_units(role)
    helper, exporter = units["blockstack-dm-helper.service"], units["blockstack-exporter.service"]
    assert "AmbientCapabilities=CAP_SYS_ADMIN\n" in helper and "PrivateNetwork=yes" in helper
    assert (
        "RestrictAddressFamilies=AF_UNIX\n" in helper
        and "DeviceAllow=/dev/mapper/control rw" in helper
    )
    assert f"--collector.dm.helper={tmp_path}/state/run/dm/helper.sock" in exporter
    assert "CapabilityBoundingSet=\n" in exporter and "/dev/mapper/control" not in exporter
    with_caps = {
        name for name, text in units.items() if re.search(r"^AmbientCapabilities=.+$", text, re.M)
    }
    assert with_caps == {"blockstack-dm-helper.service", "blockstack-ebpf-exporter.service"}, (
        with_caps
    )
    services = {name: text for name, text in units.items() if name.endswith(".service")}
    assert [
        n
        for n, text in services.items()
        if "User=root" in text or "User=" not in text or "UMask=0027" not in text
    ] == []
    assert verify(tmp_path, units) == ""
