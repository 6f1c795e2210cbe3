"""Every link of a page works where it is read.

test_real_page_links_answer_200: the stack (blockstack_deploy.stack.Stack: the exporters,
Prometheus with the project's rules, Alertmanager, the page receiver, Grafana) on 127.0.0.1, a
loop device on tmpfs read in batched sequential 4 KiB direct reads with nomerges=2 (the cheapest
real collapse: ebpf_exporter's refused-merge counter), the BlockStackMergeCollapse page as the
receiver wrote it; then every link of it is fetched as a browser would: the runbook (Prometheus
serves docs/html/ at /user/; the #anchor must be an id in the page fetched), the dashboard in
Grafana, Prometheus's generatorURL and Alertmanager's externalURL. Each must answer 200 at the
address its server listens on (a host name would resolve elsewhere than 127.0.0.1). The status of
each is printed (`-s`). About 1.5 minutes.

The rest needs no server: the external URL of each server follows where it listens or the
external host the operator sets, the commands carry it, and a docs_url set by the operator wins.
"""

import base64
import contextlib
import json
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from blockstack_deploy import grafana, roles
from blockstack_deploy.stack import COMPONENTS, DOCS_HTML, Stack
from blockstack_lab import fio, loop
from blockstack_lab.api import Alertmanager, Prometheus
from blockstack_rules import docs, knobs
from blockstack_testsupport import procs
from page_receiver import received

PAGE_TIMEOUT = 90  # seconds from the flip; the rules' worst case is 40 s (alerts/README.md)
FIO_RUNTIME = 240  # fio stops by itself even if the test is killed


def fetch(url, auth=None):
    """(status, content type, body, final URL) of a GET of url as a browser sends it: without
    its #fragment, redirects followed, basic auth when given."""
    req = urllib.request.Request(urllib.parse.urldefrag(url).url)
    if auth:
        token = base64.b64encode(":".join(auth).encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get_content_type(), r.read().decode(), r.url
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get_content_type(), e.read().decode(errors="replace"), url


def page(stack, device):
    """(notification, alert) of the first firing BlockStackMergeCollapse of device received."""
    return next(
        (
            (record["notification"], alert)
            for record, alert in received(stack.pages_file)
            if alert["status"] == "firing"
            and alert["labels"].get("alertname") == "BlockStackMergeCollapse"
            and alert["labels"].get("device") == device
        ),
        None,
    )


@pytest.mark.root
@pytest.mark.servers
# Debian's Prometheus 2.42 and Alertmanager 0.25 (the package's). Not `upstream`: its Prometheus 3,
# built from the module zip without the npm-built UI (Makefile, PROMETHEUS3), answers the
# generatorURL's /graph with 500 (seen: the runbook, the dashboard and externalURL 200 there).
@pytest.mark.parametrize("servers", ["debian"])
def test_real_page_links_answer_200(tmp_path, servers):
    with_grafana = grafana.find() is not None
    stack = Stack(
        tmp_path / "stack",
        components=COMPONENTS + (("grafana",) if with_grafana else ()),
        servers=servers,
    )
    missing = stack.missing() + (
        ["fio not found (run make deps)"] if not shutil.which("fio") else []
    )
    if missing:
        pytest.fail("missing prerequisites:\n  " + "\n  ".join(missing), pytrace=False)
    # The operator's grafana_url knob, set to where this stack's Grafana listens (a free port
    # here, 3000 under `make up`): the rules as `make generate` renders them with it.
    grafana_url = stack.external_url("grafana") if with_grafana else knobs.load()["grafana_url"]
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    rendered = knobs.rule_files(knobs.load(), grafana_url=grafana_url)
    stack.rule_files = []
    for path in knobs.HOST_RULES:
        (rules_dir / path.name).write_text(rendered[path])
        stack.rule_files.append(str(rules_dir / path.name))

    with contextlib.ExitStack() as cleanup:
        dev = cleanup.enter_context(loop.attached(256 << 20, directory="/dev/shm"))
        name = loop.name(dev)
        cleanup.enter_context(loop.sysfs_setting(dev, "queue/nomerges", 0))
        cleanup.enter_context(stack.running())
        Prometheus(stack.url("prometheus")).wait_targets_up()
        cleanup.enter_context(
            procs.running(
                [
                    "fio",
                    f"--name=links-{name}",
                    f"--filename={dev}",
                    "--readonly",
                    "--time_based",
                    f"--runtime={FIO_RUNTIME}",
                    *fio.SEQ_BATCHED_READ,
                ],
                log_path=tmp_path / f"fio-{name}.log",
            )
        )
        with loop.sysfs_setting(dev, "queue/nomerges", 2):
            flipped = time.time()
            try:
                notification, alert = procs.wait_until(
                    f"the BlockStackMergeCollapse page of {name}",
                    lambda: page(stack, name),
                    PAGE_TIMEOUT,
                )
            except TimeoutError:
                print(Prometheus(stack.url("prometheus")).collapse_state(name))
                raise
        print(f"\n{name} paged {time.time() - flipped:.1f}s after nomerges=2")

        grafana_auth = None
        if with_grafana:
            with open(stack.grafana_password_file) as f:
                grafana_auth = ("admin", f.read().strip())
        links = [
            ("runbook_url", alert["annotations"]["runbook_url"], "prometheus", None),
            ("dashboard", alert["annotations"]["dashboard"], "grafana", grafana_auth),
            ("generatorURL", alert["generatorURL"], "prometheus", None),
            ("externalURL", notification["externalURL"], "alertmanager", None),
        ]
        fetched, bodies = [], {}  # every link fetched and printed before any is judged
        for key, url, server, auth in links:
            if server == "grafana" and not with_grafana:
                print(f"{key:<13} {url}: not fetched ({grafana.HINT})")
                continue
            status, content_type, bodies[key], final = fetch(url, auth)
            fetched.append((key, url, server, status, content_type, final))
            moved = f" (redirected to {final})" if final != urllib.parse.urldefrag(url).url else ""
            print(f"{key:<13} HTTP {status} {content_type:<10} {url}{moved}")
        for key, url, server, status, content_type, final in fetched:
            assert status == 200, f"{key} {url}: HTTP {status}"
            # where the server listens, not a name that resolves elsewhere
            assert (
                urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(stack.url(server)).netloc
            ), f"{key} {url}: {server} listens at {stack.url(server)}"
            # redirects stay on the server, and never to a login page (Grafana without credentials;
            # Debian's Prometheus 2.42 answers /graph from /classic/graph, its only UI)
            moved = urllib.parse.urlsplit(final)
            assert moved.netloc == urllib.parse.urlsplit(url).netloc, f"{key} {url}: to {final}"
            assert not moved.path.endswith("/login"), f"{key} {url}: redirected to {final}"
            assert content_type == "text/html", f"{key} {url}: {content_type}"
        runbook_url = alert["annotations"]["runbook_url"]
        fragment = urllib.parse.urldefrag(runbook_url).fragment
        assert fragment == "blockstackmergecollapse", runbook_url
        assert fragment in docs.anchors(bodies["runbook_url"]), f"no id {fragment} in {runbook_url}"
        print(f"runbook_url   #{fragment}: an id in the page served")

        # The links lead to the servers that hold this page: the dashboard's uid in that Grafana,
        # the alert in that Alertmanager, the graph's expression evaluated by that Prometheus.
        if with_grafana:
            status, _, body, _ = fetch(
                f"{grafana_url}/api/dashboards/uid/blockstack-merges", grafana_auth
            )
            assert status == 200, f"dashboard uid blockstack-merges: HTTP {status}"
            # and the dashboard's own "Runbook" link, to its documentation on the same Prometheus
            (doc_link,) = [link["url"] for link in json.loads(body)["dashboard"]["links"]]
            status, content_type, _, _ = fetch(doc_link)
            print(f"{'dashboard doc':<13} HTTP {status} {content_type:<10} {doc_link}")
            assert status == 200 and content_type == "text/html", doc_link
            assert (
                urllib.parse.urlsplit(doc_link).netloc
                == urllib.parse.urlsplit(stack.url("prometheus")).netloc
            ), doc_link
        held = Alertmanager(notification["externalURL"]).alerts(
            filter=['alertname="BlockStackMergeCollapse"', f'device="{name}"']
        )
        assert len(held) == 1, held
        parts = urllib.parse.urlsplit(alert["generatorURL"])
        assert urllib.parse.parse_qs(parts.query)["g0.expr"][0].strip(), alert["generatorURL"]
        firing = Prometheus(f"{parts.scheme}://{parts.netloc}").query(
            f'ALERTS{{alertname="BlockStackMergeCollapse",device="{name}"}}'
        )
        assert firing, f"{parts.netloc} holds no BlockStackMergeCollapse of {name}"


# --- no server ---------------------------------------------------------------------------------


def argv_of(stack, component):
    return stack.commands()[component][0]


def test_external_url_is_where_each_server_listens(tmp_path):
    stack = Stack(tmp_path, components=("prometheus", "alertmanager"), ebpf_configs="")
    assert stack.external_url("prometheus") == f"http://127.0.0.1:{stack.ports['prometheus']}"
    assert stack.external_url("grafana", 3000) == "http://127.0.0.1:3000"
    prometheus, alertmanager = argv_of(stack, "prometheus"), argv_of(stack, "alertmanager")
    assert f"--web.external-url=http://127.0.0.1:{stack.ports['prometheus']}" in prometheus
    assert f"--web.user-assets={DOCS_HTML}" in prometheus
    assert f"--web.external-url=http://127.0.0.1:{stack.ports['alertmanager']}" in alertmanager

    stack.web_listen = "0.0.0.0"  # every address: the host's name (Prometheus's own default)
    stack.web_client = {"scheme": "https"}
    assert stack.external_url("alertmanager") == (
        f"https://{os.uname().nodename}:{stack.ports['alertmanager']}"
    )
    stack.web_listen = "fd00::5"
    assert stack.external_url("prometheus") == f"https://[fd00::5]:{stack.ports['prometheus']}"
    stack.external_host = "db1.example.com"  # the operator's name wins
    assert (
        stack.external_url("prometheus") == f"https://db1.example.com:{stack.ports['prometheus']}"
    )
    assert f"--web.external-url=https://db1.example.com:{stack.ports['alertmanager']}" in argv_of(
        stack, "alertmanager"
    )


def test_grafana_root_url_and_dashboard_doc_link(tmp_path):
    """Grafana's root_url is its external URL; the dashboard's documentation link is the stack's
    Prometheus's /user/dashboard.html (a page docs/html/ holds)."""
    stack = Stack(tmp_path, components=("prometheus", "grafana"), ebpf_configs="")
    stack.external_host = "db1.example.com"
    stack.render()
    ini = (tmp_path / "grafana.ini").read_text()
    assert f"root_url = http://db1.example.com:{stack.ports['grafana']}/\n" in ini
    text = (tmp_path / "grafana-dashboards" / "block-stack-merges.json").read_text()
    assert "$externalURL" not in text
    assert f'"http://db1.example.com:{stack.ports["prometheus"]}/user/dashboard.html"' in text
    assert os.path.exists(os.path.join(DOCS_HTML, "dashboard.html"))


def test_docs_url_set_by_the_operator_wins():
    """docs_url set (a wiki where docs/html/ is published): every runbook_url names it."""
    # (as test_pager.py writes its overrides: a knob is given a value in alerts/config.yml alone)
    rendered = knobs.rule_files(
        knobs.load(), **dict.fromkeys(("docs_url",), "https://wiki.example.com/bsm")
    )
    text = rendered[knobs.REPO / "alerts" / "alerts.rules.yml"]
    assert "$externalURL" not in text
    assert (
        'runbook_url: "https://wiki.example.com/bsm/runbook.html#blockstackmergecollapse"' in text
    )
    fleet = rendered[knobs.REPO / "alerts" / "fleet.rules.yml"]
    assert 'runbook_url: "https://wiki.example.com/bsm/fleet.html#blockstackhostdown"' in fleet


def test_the_operators_external_host_reaches_every_link(tmp_path):
    """`make up UP_ARGS="--listen 0.0.0.0 --external-host db1.example.com"` (EXTERNAL_HOST in the
    package's configuration): Prometheus and Alertmanager over TLS at that name."""
    role = roles.Standalone(
        tmp_path, listen="0.0.0.0", external_host="db1.example.com", ebpf_configs=""
    )
    cmds = role.commands()
    assert "--web.external-url=https://db1.example.com:9090" in cmds["prometheus"][0]
    assert "--web.external-url=https://db1.example.com:9093" in cmds["alertmanager"][0]
    assert role.stack.external_url("grafana", role.ports["grafana"]) == (
        "https://db1.example.com:3000"
    )
