"""`make up --auth`: the exposed mode's TLS + basic auth (here on 127.0.0.1: the same code path as
`--listen ADDR`, never a non-loopback address in a test) delivers a page, every listener refuses a
request without credentials, and Prometheus has no lifecycle API left."""

import json
import os
import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from blockstack_deploy import files, pki
from blockstack_lab import fio, loop
from blockstack_lab.api import Prometheus, request
from blockstack_lab.view import StackView
from blockstack_testsupport import procs

pytestmark = [pytest.mark.root, pytest.mark.servers]


def answer(url, user=None, password=None, ca=None, method=None, body=None):
    """The HTTP status, or the name of the TLS/connection error, of one request."""
    try:
        return request(url, (user, password) if user else None, ca, body, method, timeout=20)
    except urllib.error.URLError as e:
        return type(e.reason).__name__, str(e.reason)


def test_exposed_mode_pages_and_refuses_anonymous_requests(state):
    state_dir, ports, make = state
    out, _ = make("up", "--auth")
    secrets = os.path.join(state_dir, "secrets")
    ca, password = check_secrets(secrets)
    assert f"https://127.0.0.1:{ports['prometheus']}" in out
    prom, am, graf = (
        f"https://127.0.0.1:{ports[c]}" for c in ("prometheus", "alertmanager", "grafana")
    )
    grafana_password = files.secret(os.path.join(secrets, "grafana-admin-password"))
    checks = {  # each listener's URL, user and password
        "prometheus": (prom + "/api/v1/query?query=up", "admin", password),
        "alertmanager": (
            am + "/api/v2/silences",
            "alertmanager",
            files.secret(os.path.join(secrets, "alertmanager-password")),
        ),
        "grafana": (graf + "/api/datasources", "admin", grafana_password),
    }
    check_listeners(checks, ca)
    check_grafana_over_https(state_dir, graf, grafana_password, ca)
    check_no_mute_or_quit_without_password(prom, am, password, ca)

    prometheus = Prometheus(prom, auth=("admin", password), ca=ca)
    # self-scrapes over TLS with the password: every target up
    prometheus.wait_targets_up(count=8)
    # Grafana's provisioned datasource reaches Prometheus (basic auth + our CA)
    status, health = answer(
        graf + "/api/datasources/uid/blockstack-prometheus/health", "admin", grafana_password, ca=ca
    )
    assert status == 200 and json.loads(health)["status"] == "OK", health
    check_reload(make, prometheus)
    page_through_tls(state_dir, prometheus)
    check_operator_certificate(state_dir, make, checks, prom, password, ca)
    make("down")


def check_secrets(secrets):
    """The generated secrets' modes, the CA (its key gone, constrained to the server's names, a
    name of its own) and the password's bcrypt cost; (CA certificate, admin password)."""
    ca, password_file = os.path.join(secrets, "ca.crt"), os.path.join(secrets, "admin-password")
    with open(password_file) as f:
        password = f.read().strip()
    # the servers' group reads the password and the key (privileges.py); the CA key is root's alone
    for f in (password_file, os.path.join(secrets, "server.key")):
        assert oct(os.stat(f).st_mode & 0o777) == "0o640", f
    # the CA: its key gone once the server certificate is signed, constrained to the server's names
    assert not os.path.exists(os.path.join(secrets, "ca.key"))
    ca_text = subprocess.run(
        ["openssl", "x509", "-in", ca, "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (
        "X509v3 Name Constraints: critical" in ca_text and "IP:127.0.0.1/255.255.255.255" in ca_text
    ), ca_text
    assert re.search(r"Subject: CN ?= ?blockstack-ca-[0-9a-f]{12}\n", ca_text), (
        ca_text
    )  # a name of its own on every install
    with open(os.path.join(secrets, "admin-password.bcrypt")) as f:
        assert f.read().startswith("$2b$06$")  # pki.BCRYPT_COST
    return ca, password


def check_listeners(checks, ca):
    """Every listener: plain HTTP refused, TLS not trusted without our CA, 401 without or with a
    wrong password, 200 with the generated one."""
    report = {}
    for name, (url, user, secret) in checks.items():
        seen = {
            "plain http": answer(url.replace("https:", "http:"))[0],
            "https, system CAs": answer(url)[0],
            "no credentials": answer(url, ca=ca)[0],
            "wrong password": answer(url, user, "wrong", ca=ca)[0],
            "credentials": answer(url, user, secret, ca=ca)[0],
        }
        report[name] = seen
        assert seen["plain http"] == 400 or isinstance(seen["plain http"], str), (
            name,
            seen,
        )  # "HTTP to an HTTPS server"
        assert seen["https, system CAs"] == "SSLCertVerificationError", (name, seen)
        assert seen["no credentials"] == 401 and seen["wrong password"] == 401, (name, seen)
        assert seen["credentials"] == 200, (name, seen)
    print("\nlisteners:", json.dumps(report))


def check_grafana_over_https(state_dir, graf, grafana_password, ca):
    """Grafana over https: HSTS, a CSP, its session cookie Secure and SameSite=Strict."""
    with open(os.path.join(state_dir, "config", "grafana.ini")) as f:
        ini = f.read()
    for line in (
        "cookie_secure = true",
        "cookie_samesite = strict",
        "strict_transport_security = true",
        "content_security_policy = true",
        "secret_key = $__file{",
    ):
        assert line in ini, line
    login = urllib.request.Request(
        graf + "/login",
        data=json.dumps({"user": "admin", "password": grafana_password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(
        login, context=ssl.create_default_context(cafile=ca), timeout=20
    ) as r:
        headers = r.headers
    assert (
        "max-age=" in headers["Strict-Transport-Security"] and headers["Content-Security-Policy"]
    ), dict(headers)
    cookie = next(c for c in headers.get_all("Set-Cookie") if c.startswith("grafana_session="))
    assert "Secure" in cookie and "SameSite=Strict" in cookie, cookie


def check_no_mute_or_quit_without_password(prom, am, password, ca):
    """A local user can neither mute pages nor stop Prometheus without the password."""
    silence = {
        "matchers": [{"name": "alertname", "value": ".+", "isRegex": True}],
        "startsAt": "2020-01-01T00:00:00Z",
        "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "x",
        "comment": "x",
    }
    assert answer(am + "/api/v2/silences", ca=ca, method="POST", body=silence)[0] == 401
    assert answer(prom + "/-/quit", ca=ca, method="POST")[0] == 401
    assert (
        answer(prom + "/-/quit", "admin", password, ca=ca, method="POST")[0] == 403
    )  # no lifecycle API at all


def check_reload(make, prometheus):
    """`make up` again: its reload (SIGHUP through supervisord) applies."""

    def last_reload():
        return prometheus.value("prometheus_config_last_reload_success_timestamp_seconds", 0)

    before = last_reload()
    time.sleep(1.1)
    make("up", "--auth")
    procs.wait_until("the reload", lambda: last_reload() > before, 30)


def page_through_tls(state_dir, prometheus):
    """No page for healthy reads, a page for nomerges=2, every notification delivered."""
    view = StackView.from_state(state_dir)
    with fio.reads_on_ext4(runtime=300) as dev:
        name = loop.name(dev)
        procs.wait_until(
            "request sizes recorded",
            lambda: prometheus.query(
                "host_device_operation:node_disk_request_size_sectors:avg"
                f'{{device="{name}",operation="read"}} > 64'
            ),
            60,
        )
        assert not view.pages(name), "paged for healthy sequential I/O"
        with loop.sysfs_setting(dev, "queue/nomerges", "2"):
            flipped = time.monotonic()
            page = procs.wait_until("the page", lambda: view.pages(name), 90)
            print(
                f"page {time.monotonic() - flipped:.0f} s after the flip, through TLS + basic auth"
            )
        assert page[0].labels["severity"] == "critical"
    # Prometheus -> Alertmanager: nothing dropped (a notification refused with 401 counts here)
    assert prometheus.value("sum(prometheus_notifications_errors_total)") == 0


def check_operator_certificate(state_dir, make, checks, prom, password, ca):
    """The operator's certificate (from another CA) instead of the generated one, on one address
    (a loopback alias here: --listen ADDR's code path), where the stack's own clients go too."""
    theirs = os.path.join(state_dir, "operator-pki")
    their_ca = pki.make_ca(theirs, name="operator-ca")
    crt, key = pki.make_cert(theirs, "web", ["127.0.0.2"])
    make("up", f"--listen 127.0.0.2 --tls-cert {crt} --tls-key {key} --tls-ca {their_ca}")
    for name, (url, user, secret) in checks.items():
        url = url.replace("127.0.0.1", "127.0.0.2")
        assert answer(url, user, secret, ca=their_ca)[0] == 200, name
        assert answer(url, ca=their_ca)[0] == 401, name
        assert answer(url, user, secret, ca=ca)[0] == "SSLCertVerificationError", name
    Prometheus(
        prom.replace("127.0.0.1", "127.0.0.2"), auth=("admin", password), ca=their_ca
    ).wait_targets_up()
