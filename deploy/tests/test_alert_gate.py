"""The fleet's alert gate (alert_gate.py) in front of a real Alertmanager, both on 127.0.0.1 free
ports: a host's push secret pushes its own alerts and opens nothing else; the admin password is
what Alertmanager takes. The same over TLS, across namespaces, with the fleet's agents pushing for
real: deploy/tests/fleet/test_fleet.py."""

import base64
import json
import socket
import time

import pytest

from blockstack_deploy import alert_gate, fleet_auth, stack
from blockstack_lab.api import request
from blockstack_testsupport import procs
from blockstack_testsupport.clock import seconds

pytestmark = pytest.mark.servers


@pytest.fixture
def gate(tmp_path):
    secrets = fleet_auth.CentralSecrets(tmp_path / "secrets").ensure()
    h1, h2 = (fleet_auth.HostSecrets(secrets.host_dir(h), h) for h in ("h1", "h2"))
    secrets.issue("h1", "127.0.0.1")
    secrets.issue("h2", "127.0.0.1")
    am_port, gate_port = procs.free_port(), procs.free_port()
    secrets.web_config(str(tmp_path / "am-web.yml"), cert_name=None)
    (tmp_path / "am.yml").write_text("route: {receiver: none}\nreceivers: [{name: none}]\n")
    am = [
        stack.program("alertmanager"),
        f"--config.file={tmp_path}/am.yml",
        f"--storage.path={tmp_path}/am",
        f"--web.listen-address=127.0.0.1:{am_port}",
        "--cluster.listen-address=",
        f"--web.config.file={tmp_path}/am-web.yml",
    ]
    gate = [
        stack.program("gate"),
        alert_gate.__file__,
        f"--listen=127.0.0.1:{gate_port}",
        f"--alertmanager=http://127.0.0.1:{am_port}",
        f"--credentials={secrets.push_credentials}",
        f"--admin-password-file={secrets.password_file}",
    ]
    with (
        procs.running(am, log_path=str(tmp_path / "am.log")),
        procs.running(
            gate,
            health_url=f"http://127.0.0.1:{gate_port}/-/healthy",
            log_path=str(tmp_path / "gate.log"),
        ),
    ):
        admin = (secrets.user, secrets.password())
        procs.wait_until(
            "alertmanager",
            lambda: request(f"http://127.0.0.1:{am_port}/-/ready", admin)[0] == 200,
            30,
            0.2,
        )
        yield {
            "gate": f"http://127.0.0.1:{gate_port}",
            "am": f"http://127.0.0.1:{am_port}",
            "admin": admin,
            "secrets": secrets,
            "h1": ("h1", open(h1.push_password_file).read().strip()),
            "h2": ("h2", open(h2.push_password_file).read().strip()),
        }


def alert(host, name="GateTest"):
    return [{"labels": {"alertname": name, "host": host, "severity": "info"}, "annotations": {}}]


SILENCE = {
    "matchers": [{"name": "alertname", "value": ".+", "isRegex": True}],
    "startsAt": "2020-01-01T00:00:00Z",
    "endsAt": "2099-01-01T00:00:00Z",
    "createdBy": "x",
    "comment": "x",
}


def test_a_hosts_secret_pushes_its_alerts_and_nothing_else(gate):
    g, h1 = gate["gate"], gate["h1"]
    assert request(g + "/api/v2/alerts", h1, body=alert("h1"))[0] == 200
    seen = json.loads(request(gate["am"] + "/api/v2/alerts", gate["admin"])[1])
    assert [a["labels"]["host"] for a in seen if a["labels"]["alertname"] == "GateTest"] == ["h1"]
    _, silence_id = request(
        gate["am"] + "/api/v2/silences", gate["admin"], body=SILENCE
    )  # the admin's
    silence_id = json.loads(silence_id)["silenceID"]
    refused = {
        "alerts for another host": request(g + "/api/v2/alerts", h1, body=alert("h2"))[0],
        "alerts without a host": request(
            g + "/api/v2/alerts", h1, body=[{"labels": {"alertname": "x"}}]
        )[0],
        "POST silence": request(g + "/api/v2/silences", h1, body=SILENCE)[0],
        "DELETE silence": request(g + f"/api/v2/silence/{silence_id}", h1, method="DELETE")[0],
        "GET alerts": request(g + "/api/v2/alerts", h1)[0],
        "GET silences": request(g + "/api/v2/silences", h1)[0],
        "GET status": request(g + "/api/v2/status", h1)[0],
        "v1 alerts": request(g + "/api/v1/alerts", h1, body=alert("h1"))[0],
        "no credential": request(g + "/api/v2/alerts", body=alert("h1"))[0],
        "wrong secret": request(g + "/api/v2/alerts", ("h1", "wrong"), body=alert("h1"))[0],
        "h2's secret as h1": request(g + "/api/v2/alerts", ("h1", gate["h2"][1]), body=alert("h1"))[
            0
        ],
        "the admin password": request(g + "/api/v2/alerts", gate["admin"], body=alert("h1"))[0],
        "push secret at Alertmanager": request(gate["am"] + "/api/v2/silences", h1, body=SILENCE)[
            0
        ],
        "debug/pprof": request(g + "/debug/pprof/", h1)[0],
    }
    print("\nrefused:", json.dumps(refused))
    assert refused == {
        "alerts for another host": 403,
        "alerts without a host": 403,
        "POST silence": 403,
        "DELETE silence": 403,
        "GET alerts": 403,
        "GET silences": 403,
        "GET status": 403,
        "v1 alerts": 403,
        "no credential": 401,
        "wrong secret": 401,
        "h2's secret as h1": 401,
        "the admin password": 401,
        "push secret at Alertmanager": 401,
        "debug/pprof": 403,
    }
    silences = json.loads(request(gate["am"] + "/api/v2/silences", gate["admin"])[1])
    assert [s["status"]["state"] for s in silences] == ["active"], "the admin's silence must stand"
    status, _ = request(g + "/api/v2/alerts", h1, body=None, method="POST")
    assert status in (411, 415)


def test_revoked_and_added_hosts_without_restart(gate):
    g, secrets = gate["gate"], gate["secrets"]
    path = secrets.push_credentials
    with open(path) as f:
        hashes = json.load(f)
    del hashes["h2"]
    with open(path, "w") as f:
        json.dump(hashes, f)
    assert request(g + "/api/v2/alerts", gate["h2"], body=alert("h2"))[0] == 401
    h3 = fleet_auth.HostSecrets(secrets.issue("h3", "127.0.0.1").dir, "h3")
    h3_auth = ("h3", open(h3.push_password_file).read().strip())
    assert request(g + "/api/v2/alerts", h3_auth, body=alert("h3"))[0] == 200


def test_held_connections_do_not_delay_a_push(gate):
    url = gate["gate"].split("//")[1]
    host, port = url.split(":")
    held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(100)]
    try:
        for s in held:
            s.sendall(b"POST /api/v2/alerts HTTP/1.1\r\n")
        started = time.monotonic()
        assert request(gate["gate"] + "/api/v2/alerts", gate["h1"], body=alert("h1"))[0] == 200
        took = time.monotonic() - started
    finally:
        for s in held:
            s.close()
    print(f"\npush with 100 held connections: {took:.2f} s")
    assert took < seconds(2)


def test_a_malformed_or_http_0_9_request_gets_400_and_forwards_nothing(gate, http_abuse):
    """The gate's connections are blockstack_http's: a request line without a version (HTTP/0.9,
    which http.server answered with a bare body) or a malformed header is a 400 with headers, and a
    push cut off in its headers or body reaches no one (a body cut off is a 400)."""
    port = int(gate["gate"].rsplit(":", 1)[1])
    h1 = "Basic " + base64.b64encode(":".join(gate["h1"]).encode()).decode()
    push = json.dumps(alert("h1", "GateMalformed")).encode()
    head = f"POST /api/v2/alerts HTTP/1.1\r\nAuthorization: {h1}\r\nContent-Type: application/json\r\n".encode()
    malformed = {
        "HTTP/0.9": b"GET /-/healthy\r\n\r\n",
        "a control character in the target": b"GET /-/healthy?\x01 HTTP/1.1\r\n\r\n",
        "a header without a colon": head + b"Content-Length %d\r\n\r\n" % len(push) + push,
        "a folded header": head + b"Content-Length: %d\r\n x\r\n\r\n" % len(push) + push,
    }
    answers = {name: http_abuse.raw(port, data)[:200] for name, data in malformed.items()}
    assert {name: a.split(b"\r\n")[0] for name, a in answers.items()} == dict.fromkeys(
        malformed, b"HTTP/1.0 400 Bad request line"
    ) | {
        "a header without a colon": b"HTTP/1.0 400 Bad header line",
        "a folded header": b"HTTP/1.0 400 Bad header line",
    }
    assert all(b"\r\nContent-Length: " in a for a in answers.values()), answers
    cut = head + b"Content-Length: %d\r\n\r\n" % len(push) + push[:-1]
    assert http_abuse.raw(port, cut, end=True).startswith(
        b"HTTP/1.0 400 "
    )  # body shorter than Content-Length
    assert http_abuse.raw(port, head, end=True) == b""
    seen = json.loads(request(gate["am"] + "/api/v2/alerts", gate["admin"])[1])
    assert [a for a in seen if a["labels"]["alertname"] == "GateMalformed"] == []
    assert (
        request(gate["gate"] + "/api/v2/alerts", gate["h1"], body=alert("h1", "GateMalformed"))[0]
        == 200
    )
