"""`make up` end to end: the supervised stack in a temporary state directory on free ports,
a loop-device ext4 under sequential direct reads, a merge collapse paged and resolved, every
component killed once and restarted, `make down` leaving nothing behind; each server under its
own user with its capabilities (privileges.py), the watchdog at the receiver, what a web page
of a foreign origin can do to each listener, and no /debug/pprof/ without credentials."""

import http.client
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from blockstack_deploy import files
from blockstack_deploy.supervisor import Supervisor
from blockstack_lab import fio, loop
from blockstack_lab.api import Alertmanager, Prometheus, request
from blockstack_lab.view import StackView
from blockstack_testsupport import procs

pytestmark = [pytest.mark.root, pytest.mark.servers]

COMPONENTS = (
    "node",
    "blockstack",
    "ebpf",
    "receiver",
    "receiver-self",
    "alertmanager",
    "prometheus",
    "grafana",
)  # conftest.state's ports
PROGRAMS = COMPONENTS + ("front",)  # metrics_front.py: the exporters' /metrics on their ports


def pids(state):
    return {name: Supervisor(state).program_pid(name) for name in PROGRAMS}


def identities(state):
    """{program: (user, CapEff as a hex string, NoNewPrivs)} from /proc/PID/status; the `ps` view printed."""
    out = {}
    for name, pid in pids(state).items():
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        uid = int(status["Uid"].split()[0])
        out[name] = (
            pwd.getpwuid(uid).pw_name,
            status["CapEff"].strip(),
            status["NoNewPrivs"].strip(),
        )
    ps = subprocess.run(
        ["ps", "-o", "user:22,pid,args", "-p", ",".join(str(p) for p in pids(state).values())],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    print("\n" + "\n".join(line[:140] for line in ps.splitlines()))
    return out


def foreign(url, method="GET", headers=(), body=None):
    """(status, Access-Control-Allow-Origin) of a request as a web page of another origin sends it."""
    parts = http.client.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
    try:
        conn.request(
            method,
            parts.path + (f"?{parts.query}" if parts.query else ""),
            body=body,
            headers={"Origin": "http://evil.example", **dict(headers)},
        )
        r = conn.getresponse()
        r.read()
        return r.status, r.getheader("Access-Control-Allow-Origin")
    finally:
        conn.close()


def test_make_up_pages_on_collapse_survives_kills_and_leaves_nothing(state):
    state_dir, ports, make = state
    out, cold = make("up")
    assert "Prometheus" in out and f":{ports['prometheus']}" in out
    assert "Grafana" in out  # either its URL or the one line on how to add it
    before = pids(state_dir)
    assert all(before.values()), before
    conf_mtime = os.stat(os.path.join(state_dir, "supervisord.conf")).st_mtime

    password_file = check_grafana_password(state_dir, ports, out)
    check_least_privilege(state_dir)
    admin = check_foreign_origins(state_dir, ports)
    check_no_pprof_without_credentials(state_dir, ports)
    check_grafana_locked(state_dir, ports, password_file)

    out, warm = make("up")
    assert pids(state_dir) == before, "a second make up restarted something"
    assert os.stat(os.path.join(state_dir, "supervisord.conf")).st_mtime == conf_mtime
    print(f"\nmake up: cold {cold:.1f} s, warm {warm:.1f} s")

    prometheus = Prometheus(f"http://127.0.0.1:{ports['prometheus']}", auth=admin)
    view = StackView.from_state(state_dir)
    with fio.reads_on_ext4(runtime=400) as dev:
        name = loop.name(dev)
        wait_healthy_reads(ports, prometheus, name)
        with loop.sysfs_restored(dev, "queue/scheduler"):
            scheduler = kill_each_component(state_dir, make, prometheus, dev)
            page_and_resolve(state_dir, prometheus, view, dev, scheduler)

    make("down")
    check_nothing_left(state_dir)


def check_grafana_password(state_dir, ports, out):
    """Grafana: provisioned, admin with the generated password only, its database in the state
    directory; the password file is returned."""
    password_file = os.path.join(state_dir, "secrets", "grafana-admin-password")
    assert f"127.0.0.1:{ports['grafana']}/d/blockstack-merges" in out and password_file in out
    # readable by the servers' group only (privileges.py)
    assert (
        oct(os.stat(password_file).st_mode & 0o777) == "0o640"
        and os.stat(password_file).st_uid == 0
    )
    return password_file


def check_least_privilege(state_dir):
    """No program runs as root; the BPF loader holds no capability once attached (no
    device-mapper here: no dm helper, the only holder of one; tests/test_privilege.py)."""
    seen = identities(state_dir)
    assert seen == {
        "node": ("blockstack-node", "0" * 16, "1"),
        "blockstack": ("blockstack-exporter", "0" * 16, "1"),
        "ebpf": ("blockstack-ebpf", "0" * 16, "1"),
        "receiver": ("blockstack-receiver", "0" * 16, "1"),
        "receiver-self": ("blockstack-receiver", "0" * 16, "1"),
        "alertmanager": ("blockstack-alertmanager", "0" * 16, "1"),
        "prometheus": ("blockstack-prometheus", "0" * 16, "1"),
        "grafana": ("blockstack-grafana", "0" * 16, "1"),
        "front": ("blockstack-front", "0" * 16, "1"),
    }, seen


def check_foreign_origins(state_dir, ports):
    """A web page of another origin: Alertmanager and Prometheus want the password (a silence
    through v2's JSON API or 0.25's v1 text/plain one, a query), the receiver wants its token and
    JSON; one password per server. Returns Prometheus's (user, password)."""
    am, prom, rcv = (
        f"http://127.0.0.1:{ports[c]}" for c in ("alertmanager", "prometheus", "receiver")
    )
    silence = json.dumps(
        {
            "matchers": [{"name": "alertname", "value": ".+", "isRegex": True}],
            "startsAt": "2020-01-01T00:00:00Z",
            "endsAt": "2099-01-01T00:00:00Z",
            "createdBy": "x",
            "comment": "x",
        }
    )
    browser = {
        "alertmanager preflight": foreign(
            am + "/api/v2/silences", "OPTIONS", {"Access-Control-Request-Method": "POST"}
        ),
        "alertmanager v2 silence": foreign(
            am + "/api/v2/silences", "POST", {"Content-Type": "application/json"}, silence
        ),
        "alertmanager v1 silence (text/plain)": foreign(
            am + "/api/v1/silences", "POST", {"Content-Type": "text/plain"}, silence
        ),
        "prometheus query": foreign(prom + "/api/v1/query?query=up"),
        "receiver page (text/plain)": foreign(
            rcv + "/page", "POST", {"Content-Type": "text/plain"}, "{}"
        ),
    }
    print("\nforeign origin:", json.dumps(browser))
    assert browser == {
        "alertmanager preflight": (401, None),
        "alertmanager v2 silence": (401, None),
        "alertmanager v1 silence (text/plain)": (401, None),
        "prometheus query": (401, None),
        "receiver page (text/plain)": (401, None),
    }, browser
    admin = ("admin", files.secret(os.path.join(state_dir, "secrets", "admin-password")))
    silencer = (
        "alertmanager",
        files.secret(os.path.join(state_dir, "secrets", "alertmanager-password")),
    )
    assert request(am + "/api/v2/status", silencer)[0] == 200
    assert request(prom + "/api/v1/query?query=up", admin)[0] == 200
    # one password per server: Prometheus's reader cannot silence a page, nor the reverse
    assert (
        request(am + "/api/v2/status", admin)[0] == 401
        and request(prom + "/api/v1/query?query=up", silencer)[0] == 401
    )
    return admin


def check_no_pprof_without_credentials(state_dir, ports):
    """Go's /debug/pprof/ without credentials: Prometheus and Alertmanager want the password, the
    exporters' ports answer /metrics only (metrics_front.py); behind them, the exporters' sockets
    (which still serve it) are closed to any user but root and the front."""
    pprof = {
        c: request(f"http://127.0.0.1:{ports[c]}/debug/pprof/")[0]
        for c in ("prometheus", "alertmanager", "node", "ebpf")
    }
    print("/debug/pprof/ without credentials:", json.dumps(pprof))
    assert pprof == {"prometheus": 401, "alertmanager": 401, "node": 404, "ebpf": 404}, pprof
    assert all(request(f"http://127.0.0.1:{ports[c]}/metrics")[0] == 200 for c in ("node", "ebpf"))
    for c in ("node", "ebpf"):
        sock = os.path.join(state_dir, "run", c, "metrics.sock")
        curl = [
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--unix-socket",
            sock,
            "http://x/debug/pprof/",
        ]
        as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *curl]
        seen_socket = [
            subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
            for argv in (curl, as_nobody)
        ]
        assert seen_socket == ["200", "000"], (c, seen_socket)


def check_grafana_locked(state_dir, ports, password_file):
    """Grafana's API: the provisioned dashboard for admin with its password only; nothing phones
    home; its database in the state directory."""
    dashboard = f"http://127.0.0.1:{ports['grafana']}/api/dashboards/uid/blockstack-merges"
    status, found = request(dashboard, ("admin", files.secret(password_file)))
    assert status == 200 and json.loads(found)["meta"]["provisioned"], found
    assert request(dashboard, ("admin", "wrong"))[0] == 401
    assert request(dashboard)[0] == 401, "anonymous access to Grafana's API"
    with open(os.path.join(state_dir, "config", "grafana.ini")) as f:
        ini = f.read()
    for off in (
        "reporting_enabled = false",
        "check_for_updates = false",
        "check_for_plugin_updates = false",
        "news_feed_enabled = false",
        "preinstall_disabled = true",
        "public_key_retrieval_disabled = true",
        "disable_gravatar = true",
    ):
        assert off in ini
    assert os.path.exists(os.path.join(state_dir, "grafana", "data", "grafana.db"))


def wait_healthy_reads(ports, prometheus, name):
    """Every target up, the watchdog at the receiver, the loop device's large sequential reads."""
    prometheus.wait_targets_up(
        count=8
    )  # the exporters, the two receivers, Alertmanager, Prometheus, Grafana
    # the watchdog reaches the dead man's switch (here the receiver's /watchdog) without a page
    procs.wait_until(
        "the watchdog at the receiver",
        lambda: (
            'path="/watchdog",code="200"'
            in request(f"http://127.0.0.1:{ports['receiver']}/metrics")[1]
        ),
        90,
    )
    # healthy sequential reads: large requests at the loop device, and no page
    procs.wait_until(
        "request sizes recorded",
        lambda: prometheus.query(
            "host_device_operation:node_disk_request_size_sectors:avg"
            f'{{device="{name}",operation="read"}} > 64'
        ),
        60,
    )


def kill_each_component(state_dir, make, prometheus, dev):
    """Faults: each component killed once, the supervisor restarts it, and Prometheus keeps the
    samples from before its restart. The device's scheduler changes while Prometheus is down
    (stopped, then killed): the series of the scheduler before stays visible after the restart
    (no staleness marker) beside the one of now, as any setting changed across a restart does
    (in make test, another test's devices; the page then lost its facts). Returns the scheduler
    of now."""
    name = loop.name(dev)
    # up to 10 s ago: a scrape in flight (stamped when it started, stored when it ends; a
    # scrape times out after its 5 s interval) would add a sample to the range after this query
    # the device's first samples at least 10 s old (three at the 5 s interval): on a quiet machine
    # the lines above take less than that since the device was made
    procs.wait_until(
        "10 s of the device's samples",
        lambda: prometheus.query(
            f'count_over_time(node_disk_reads_completed_total{{device="{name}"}}[1m]) >= 3'
        ),
        60,
    )
    first_sample_time = time.time() - 10
    samples_query = (
        f'node_disk_reads_completed_total{{device="{name}"}}',
        first_sample_time - 60,
        first_sample_time,
        1,
    )
    before_kills = prometheus.query_range(*samples_query)
    assert before_kills and before_kills[0]["values"]
    # another scheduler than the one in use (in brackets)
    scheduler = next(s for s in loop.read_sysfs(dev, "queue/scheduler").split() if s[0] != "[")
    for component in PROGRAMS:
        old = pids(state_dir)[component]
        if component == "prometheus":
            os.kill(old, signal.SIGSTOP)
            loop.write_sysfs(dev, "queue/scheduler", scheduler)
        os.kill(old, signal.SIGKILL)
        procs.wait_until(
            f"{component} restarted",
            lambda: (pids(state_dir)[component] or old) != old,
            30,
            0.2,
        )
    make("up")  # waits for every health endpoint again
    prometheus.wait_targets_up()
    # Prometheus kept the samples from before its restart
    assert prometheus.query_range(*samples_query) == before_kills
    return scheduler


def page_and_resolve(state_dir, prometheus, view, dev, scheduler):
    """No page for healthy reads; nomerges=2 pages with the device's settings of now; the
    receiver killed as the collapse ends, the resolve still arrives."""
    name = loop.name(dev)
    assert not view.pages(name), "paged for healthy sequential I/O"
    with loop.sysfs_setting(dev, "queue/nomerges", "2"):
        flipped = time.monotonic()
        try:
            page = procs.wait_until("the page", lambda: view.pages(name), 60)
        except TimeoutError:
            print(prometheus.collapse_state(name))
            raise
        to_page = time.monotonic() - flipped
        labels = page[0].labels
        assert labels["severity"] == "critical" and labels["host"] and labels["device"] == name
        description = page[0].annotations["description"]
        if f"scheduler {scheduler}." not in description:
            print(prometheus.collapse_state(name))
        assert "Now: nomerges=2, " in description and f"scheduler {scheduler}." in description
    resolved_from = time.monotonic()
    # the receiver dies right as the collapse ends: Alertmanager retries, the resolve arrives.
    # (Alertmanager itself was killed before the flip; a SIGKILLed single Alertmanager
    # forgets which pages it sent, so it could not send their resolves: that is what the
    # fleet's Alertmanager cluster is for.)
    os.kill(pids(state_dir)["receiver"], signal.SIGKILL)
    # the collapse page is held 90 s after its evidence clears (keep_firing_for): ~140 s
    procs.wait_until("the resolve", lambda: view.pages(name, "resolved"), 200)
    print(
        f"page {to_page:.0f} s after the flip, "
        f"resolved {time.monotonic() - resolved_from:.0f} s after the flip back"
    )


def check_nothing_left(state_dir):
    """After make down: no process of the stack, the data and Grafana's database kept."""
    assert not subprocess.run(
        ["pgrep", "-f", state_dir], capture_output=True, text=True
    ).stdout.strip()
    assert os.path.isdir(os.path.join(state_dir, "data", "prometheus")), "make down must keep data"
    assert os.path.exists(os.path.join(state_dir, "grafana", "data", "grafana.db")), (
        "make down must keep Grafana's database"
    )


@pytest.mark.built  # Prometheus 3 and Alertmanager 0.31 (make upstream-servers)
@pytest.mark.long
def test_make_up_switches_servers(state):
    """`make up SERVERS=upstream` runs Prometheus 3 and the current Alertmanager; `make up
    SERVERS=debian` on the same state switches back, restarting only those two (the collapse ->
    page on each set is alerts/tests/test_integration.py's)."""
    from blockstack_deploy.stack import ALERTMANAGER_UPSTREAM_VERSION, PROMETHEUS3_VERSION

    state_dir, ports, make = state

    prometheus = Prometheus(f"http://127.0.0.1:{ports['prometheus']}")
    alertmanager = Alertmanager(f"http://127.0.0.1:{ports['alertmanager']}")

    def versions():
        return prometheus.buildinfo()["version"], alertmanager.status()["versionInfo"]["version"]

    out, _ = make("up", variables=["SERVERS=upstream"])
    assert "servers: upstream" in out
    prometheus.auth = ("admin", files.secret(os.path.join(state_dir, "secrets", "admin-password")))
    alertmanager.auth = (
        "alertmanager",
        files.secret(os.path.join(state_dir, "secrets", "alertmanager-password")),
    )
    assert versions() == (PROMETHEUS3_VERSION, ALERTMANAGER_UPSTREAM_VERSION)
    prometheus.wait_targets_up()
    before = pids(state_dir)
    out, _ = make("up", variables=["SERVERS=debian"])
    assert "servers: debian" in out
    prometheus2, alertmanager025 = versions()
    assert prometheus2.startswith("2.") and alertmanager025.startswith("0.25"), (
        prometheus2,
        alertmanager025,
    )
    after = pids(state_dir)
    assert {c for c in PROGRAMS if after[c] != before[c]} == {"prometheus", "alertmanager"}
    make("down")


def test_make_up_on_a_kernel_that_loads_no_bpf(state):
    """A kernel where no set of BPF programs loads (before 5.10, no BTF): `make up` starts the rest
    of the stack and says so, instead of starting nothing; blockstack-exporter publishes the sets'
    status and the real Prometheus holds BlockStackCollapseEvidenceMissing for the host. Made here
    with a build directory (BLOCKSTACK_BUILD) whose BPF objects this kernel refuses: the block set
    not built at all, the jbd2 set only as its fexit variant (EPERM here) and its legacy one (an
    attach point 6.1 and older have)."""
    state_dir, ports, make = state
    real = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".build")
    # the servers' users read Grafana and the rest through it: not under pytest's 0700 tmp_path
    build = tempfile.mkdtemp(prefix="blockstack-build-", dir="/var/tmp")
    try:
        os.chmod(build, 0o755)
        os.mkdir(os.path.join(build, "ebpf-configs"))
        for name in os.listdir(real):
            if name != "ebpf-configs":
                os.symlink(os.path.join(real, name), os.path.join(build, name))
        for config in ("jbd2_credit_wait_fexit", "jbd2_credit_wait_legacy"):
            for ext in (".bpf.o", ".yaml"):
                os.symlink(
                    os.path.join(real, "ebpf-configs", config + ext),
                    os.path.join(build, "ebpf-configs", config + ext),
                )
        blind_stack(state, build)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def blind_stack(state, build):
    state_dir, ports, make = state
    out, _ = make("up", variables=[f"BLOCKSTACK_BUILD={build}"])
    assert (
        "WARNING: no block BPF programs load on this kernel (the collapse page cannot fire on this host): "
        f"block_io: not built in {build}/ebpf-configs" in out
    ), out
    assert "WARNING: no jbd2 BPF programs load on this kernel: jbd2_credit_wait_fexit: " in out, out
    assert "ebpf_exporter  not started" in out, out
    assert Supervisor(state_dir).program_pid("ebpf") is None
    assert all(
        Supervisor(state_dir).program_pid(c)
        for c in ("node", "blockstack", "prometheus", "alertmanager")
    )

    prometheus = Prometheus(f"http://127.0.0.1:{ports['prometheus']}")
    prometheus.auth = ("admin", files.secret(os.path.join(state_dir, "secrets", "admin-password")))
    loaded = procs.wait_until(
        "the sets' status in Prometheus", lambda: prometheus.query("blockstack_ebpf_set_loaded"), 60
    )
    assert {(r["metric"]["set"], r["metric"].get("config", ""), r["value"][1]) for r in loaded} == {
        ("block", "", "0"),
        ("jbd2", "", "0"),
    }, loaded
    assert not prometheus.query('up{job="ebpf"}')  # not scraped: nothing to scrape
    pending = procs.wait_until(
        "BlockStackCollapseEvidenceMissing pending",
        lambda: prometheus.query('ALERTS{alertname="BlockStackCollapseEvidenceMissing"}'),
        60,
    )
    assert pending[0]["metric"]["alertstate"] in ("pending", "firing"), pending
    make("down")
