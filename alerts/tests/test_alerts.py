"""Static checks of alerts/: generated rules current, promtool and amtool happy, every rule tested,
every alert with a runbook anchor, routing as documented, and the webhook receiver writing lines.
promtool and amtool run in both tested sets of servers (blockstack_deploy.stack.SERVERS): Debian's
Prometheus 2 / Alertmanager 0.25 and the pinned Prometheus 3 / current Alertmanager."""

import json
import pathlib
import re
import subprocess
import sys
import threading
import urllib.request

import pytest
import yaml

import page_receiver
from blockstack_deploy import stack
from blockstack_rules import docs as rendered_docs
from blockstack_rules import knobs

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"
TESTS = ALERTS / "tests"
RULE_FILES = sorted(ALERTS.glob("*.rules.yml"))
AM_CONFIG = ALERTS / "alertmanager.yml"


def tool(name, servers="debian"):
    """promtool or amtool of a set of servers; a missing one fails, naming the make target."""
    try:
        path = stack.program(name, servers)
    except FileNotFoundError as e:
        pytest.fail(str(e), pytrace=False)
    r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    print(r.stdout.splitlines()[0] if r.stdout else r.stderr)  # the version this test ran
    return path


servers_matrix = pytest.mark.parametrize("servers", list(stack.SERVERS))


def run(argv):
    # promtool on alerts.test.yml: ~1 min of one core alone, 4 min at load 20 on the 2-core host
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(map(str, argv))}\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.mark.built
@pytest.mark.long
def test_upstream_servers_are_the_pinned_versions():
    """The Makefile builds what stack.SERVERS runs, and each binary reports that version."""
    # make's own values (make -qp prints its variables, evaluated)
    make = subprocess.run(
        ["make", "-qp", "-C", str(ROOT)], capture_output=True, text=True, timeout=60
    ).stdout
    pinned = {
        name: re.search(rf"^{var}\s*:=\s*(\S+)", make, re.M).group(1)
        for name, var in (
            ("prometheus", "PROMETHEUS3_VERSION"),
            ("alertmanager", "ALERTMANAGER_UPSTREAM_VERSION"),
        )
    }
    assert pinned == {
        "prometheus": stack.PROMETHEUS3_VERSION,
        "alertmanager": stack.ALERTMANAGER_UPSTREAM_VERSION,
    }
    module = re.search(r"^PROMETHEUS3_MODULE\s*:=\s*(\S+)", make, re.M).group(1)
    major, minor, patch = pinned["prometheus"].split(".")
    assert module == f"v0.{major}{int(minor):02d}.{patch}", (
        "Prometheus 3.X.Y is module version v0.3XX.Y"
    )
    for name in ("prometheus", "promtool", "alertmanager", "amtool"):
        version = pinned["alertmanager" if name in ("alertmanager", "amtool") else "prometheus"]
        out = subprocess.run(
            [tool(name, "upstream"), "--version"], capture_output=True, text=True, timeout=30
        )
        assert f"{name}, version {version} " in out.stdout + out.stderr


def rules(kind):
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if kind in rule:
                    yield path, rule


def test_rule_files_exist():
    assert RULE_FILES == sorted(knobs.HOST_RULES + [knobs.FLEET_RULES])


def test_generated_rules_are_current():
    run([sys.executable, "-m", "blockstack_rules.knobs", "--check"])


@servers_matrix
@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path, servers):
    out = run([tool("promtool", servers), "check", "rules", str(path)])
    assert "SUCCESS" in out


@servers_matrix
@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests(path, servers):
    """One test file per rules file (alerts/tests/NAME.test.yml for alerts/NAME.rules.yml)."""
    test_file = TESTS / path.name.replace(".rules.yml", ".test.yml")
    assert test_file.exists(), f"no promtool test file for {path.name}"
    out = run([tool("promtool", servers), "test", "rules", str(test_file)])
    assert "SUCCESS" in out


def load_tests(name):
    return yaml.safe_load((TESTS / name).read_text())


def test_every_test_case_is_named():
    for path in TESTS.glob("*.test.yml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            assert case.get("name"), f"{path.name}: a test case without a name"


def test_every_recording_rule_is_tested():
    tested = " ".join(
        t["expr"]
        for case in load_tests("recording.test.yml")["tests"]
        for t in case.get("promql_expr_test", [])
    )
    for _, rule in rules("record"):
        assert re.search(re.escape(rule["record"]) + r"(\{|\b)", tested), (
            f"{rule['record']} untested"
        )


def test_every_recording_rule_is_named_level_metric_operation_with_a_comment():
    for path in RULE_FILES:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"\s*- record: (\S+)", line)
            if m:
                assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", m.group(1)), m.group(1)
                assert lines[i - 1].strip().startswith("#"), f"{m.group(1)} has no comment"


def test_every_alert_has_positive_and_negative_cases():
    fired, silent = set(), set()
    for case in load_tests("alerts.test.yml")["tests"] + load_tests("fleet.test.yml")["tests"]:
        for t in case.get("alert_rule_test", []):
            (fired if t.get("exp_alerts") else silent).add(t["alertname"])
    for _, rule in rules("alert"):
        assert rule["alert"] in fired, f"{rule['alert']}: no case where it fires"
        assert rule["alert"] in silent, f"{rule['alert']}: no case where it must not fire"


def test_alerts_follow_the_style():
    for _, rule in rules("alert"):
        name = rule["alert"]
        assert re.fullmatch(r"BlockStack[A-Z][A-Za-z0-9]+", name), name
        assert rule.get("for"), f"{name}: no for:"
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        for key in ("summary", "description", "runbook_url"):
            assert rule["annotations"].get(key), f"{name}: no {key}"
        assert "{{" in rule["annotations"]["description"], f"{name}: description not templated"
        assert rule["annotations"]["runbook_url"].endswith("#" + name.lower()), name


def test_every_alert_has_a_runbook_anchor():
    """runbook_url is the docs_url knob, then runbook.html or fleet.html, then #alertname: an id
    in the page Prometheus serves (docs/html/, rendered from docs/*.md; the rendering is current:
    test_docs_html_is_current)."""
    names = [rule["alert"] for _, rule in rules("alert")]
    assert len(names) == len(set(names))
    docs = knobs.load()["docs_url"] + "/"
    for _, rule in rules("alert"):
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(docs), url
        doc, _, anchor = url[len(docs) :].partition("#")
        assert doc in ("runbook.html", "fleet.html"), url
        assert anchor in rendered_docs.anchors((ROOT / "docs" / "html" / doc).read_text()), (
            f"docs/html/{doc} has no element with id {anchor} (a section of docs/{doc[:-5]}.md)"
        )


def test_docs_html_is_current():
    """docs/html/ is what `make generate` renders from docs/*.md now."""
    assert rendered_docs.main(["--check"]) == 0, "docs/html/ is stale: run `make generate`"


@servers_matrix
def test_amtool_check_config(servers):
    out = run([tool("amtool", servers), "check-config", str(AM_CONFIG)])
    assert "SUCCESS" in out


@pytest.mark.parametrize(
    "labels,receiver",
    [
        (
            [
                "severity=critical",
                "alertname=BlockStackMergeCollapse",
                "host=db1",
                "device=nvme1n1",
            ],
            "page",
        ),
        (
            ["severity=critical", "alertname=BlockStackSnapshotInvalid", "host=db1", "device=dm-3"],
            "page",
        ),
        (["severity=warning", "alertname=BlockStackNomergesBeneathStack", "host=db1"], "ticket"),
        (["severity=info", "alertname=BlockStackMaxSectorsLow", "host=db1"], "ticket"),
        (["severity=info", "alertname=BlockStackWatchdog", "host=db1"], "deadmansswitch"),
        (
            [
                "severity=critical",
                "alertname=BlockStackNotificationsFailing",
                "host=db1",
                "integration=webhook",
            ],
            "pagerself,page",
        ),
        (["severity=critical", "alertname=BlockStackHeartbeatStale", "host=db1"], "pagerself,page"),
        (
            ["severity=warning", "alertname=BlockStackPrometheusTSDBFailing", "host=db1"],
            "pagerself,ticket",
        ),
        (
            ["severity=warning", "alertname=BlockStackPrometheusErrorSendingAlerts", "host=db1"],
            "pagerself,ticket",
        ),
        (
            [
                "severity=critical",
                "alertname=BlockStackEvidenceExporterDown",
                "host=db1",
                "job=ebpf",
            ],
            "page",
        ),
    ],
)
@servers_matrix
def test_routing(labels, receiver, servers):
    out = run(
        [tool("amtool", servers), "config", "routes", "test", f"--config.file={AM_CONFIG}", *labels]
    )
    assert out.strip() == receiver


def test_every_critical_alert_pages_and_the_rest_do_not():
    config = yaml.safe_load(AM_CONFIG.read_text())
    page_route = next(r for r in config["route"]["routes"] if r["receiver"] == "page")
    watchdog_route = config["route"]["routes"][0]
    assert (
        watchdog_route["receiver"] == "deadmansswitch" and watchdog_route["group_interval"] == "1m"
    )
    # a heartbeat every minute, not every other (alerts/alertmanager.yml)
    assert int(watchdog_route["repeat_interval"].rstrip("s")) < 60
    assert page_route["matchers"] == ['severity="critical"']
    # a page's or ticket's group is what an operator acts on; the stack around the device may
    # change under it, and no alert carries it as a label (test_no_alert_carries_the_stack)
    assert config["route"]["group_by"] == ["host", "device"]
    assert page_route["group_by"] == ["host", "device"]
    assert pytest.approx(5) == int(page_route["group_wait"].rstrip("s"))
    severities = {rule["alert"]: rule["labels"]["severity"] for _, rule in rules("alert")}
    assert {a for a, s in severities.items() if s == "critical"} == {
        "BlockStackMergeCollapse",
        "BlockStackSnapshotCowNearlyFull",
        "BlockStackSnapshotInvalid",
        "BlockStackHostDown",
        # the pager itself: a page lost, an alert that cannot fire, the pager's disk or servers
        "BlockStackNotificationsFailing",
        "BlockStackRuleEvaluationFailing",
        "BlockStackPagerDown",
        "BlockStackPagerDiskFilling",
        "BlockStackReceiverWriteFailing",
        "BlockStackHeartbeatStale",
        "BlockStackPrometheusBadConfig",
        "BlockStackAlertmanagerBadConfig",
        "BlockStackPrometheusNotConnectedToAlertmanagers",
        # the collapse evidence gone: no collapse can page
        "BlockStackEvidenceExporterDown",
    }


def test_no_alert_carries_the_stack():
    """An alert's labels are its identity: the stack above a device changes (a snapshot created)
    while what is wrong with the device does not, so no rule sets `stack` (a new identity would
    restart the `for:`), and Alertmanager groups by nothing an alert lacks."""
    for _, rule in rules("alert"):
        assert "stack" not in rule.get("labels", {}), rule["alert"]
        assert "group_left (stack)" not in rule["expr"], rule["alert"]
    config = yaml.safe_load(AM_CONFIG.read_text())
    routes = [config["route"], *config["route"]["routes"]]
    assert all("stack" not in r.get("group_by", []) for r in routes)


def test_the_pagers_own_alerts_go_to_the_second_notifier_too():
    """Every alert of group blockstack-pager but the watchdog and Grafana's matches the `pagerself`
    route (a notifier that needs neither the page receiver nor its disk), which continues to the
    page or ticket route; no other alert does."""
    config = yaml.safe_load(AM_CONFIG.read_text())
    route = next(r for r in config["route"]["routes"] if r["receiver"] == "pagerself")
    assert route["continue"] is True
    matcher = re.fullmatch(r'alertname=~"(.+)"', route["matchers"][0]).group(1)
    groups = {
        rule["alert"]: group["name"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    own = {a for a, g in groups.items() if g == "blockstack-pager"} - {
        "BlockStackWatchdog",
        "BlockStackGrafanaDown",
    }
    assert {a for a in groups if re.fullmatch(matcher, a)} == own


def test_collapse_page_identity_has_no_settings():
    """A setting changed, or the stack above taken apart, during a page must not end one alert and
    start another: the collapse page's labels are host, device and operation only (settings and
    the stack are in annotations)."""
    rule = next(r for _, r in rules("alert") if r["alert"] == "BlockStackMergeCollapse")
    assert set(rule["labels"]) == {"severity"}
    by = re.search(r"max by \(([^)]*)\)", rule["expr"]).group(1)
    assert [x.strip() for x in by.split(",")] == ["host", "device", "operation"]
    assert not re.search(r"\bstack\b", rule["expr"])
    assert rule.get("keep_firing_for"), "an intermittent collapse must page once"


def test_inhibition_holds_whatever_the_stack_does():
    """The page has no stack label: inhibiting on it would never match (and a stack label would
    split one incident when the stack changes)."""
    config = yaml.safe_load(AM_CONFIG.read_text())
    for rule in config["inhibit_rules"]:
        if rule["source_matchers"] == ['alertname="BlockStackMergeCollapse"']:
            assert rule["equal"] == ["host", "device"]


def test_annotation_templates_are_readable():
    """No line of a rule template (annotations included) is hundreds of characters long: long
    annotations are written over several lines with {{- -}} trimming."""
    for path in sorted((ROOT / "alerts" / "src").glob("*.rules.yml.in")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert len(line) <= 200, f"{path.name}:{number}: a line of {len(line)} characters"


def test_inhibition_names_existing_alerts():
    config = yaml.safe_load(AM_CONFIG.read_text())
    names = {rule["alert"] for _, rule in rules("alert")}
    for rule in config["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            m = re.fullmatch(r'alertname=~?"([^"]+)"', matcher)
            if m:
                for name in m.group(1).split("|"):
                    assert name in names, f"inhibit rule names unknown alert {name}"


def test_receiver_writes_one_json_line_per_notification(tmp_path):
    out = tmp_path / "n.jsonl"
    server = page_receiver.serve("127.0.0.1:0", str(out))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert urllib.request.urlopen(base + "/healthz", timeout=5).read() == b"ok\n"
        payload = {
            "receiver": "page",
            "status": "firing",
            "alerts": [{"status": "firing", "labels": {"alertname": "BlockStackMergeCollapse"}}],
        }
        for _ in range(2):
            req = urllib.request.Request(
                base + "/page",
                data=json.dumps(payload).encode(),
                headers={"Content-Type": "application/json"},
            )
            assert urllib.request.urlopen(req, timeout=5).status == 200
        req = urllib.request.Request(base + "/page", data=b"not json")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(req, timeout=5)
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert [rec["notification"] for rec in lines] == [payload, payload]
        assert {rec["path"] for rec in lines} == {"/page"}
    finally:
        server.shutdown()
        server.server_close()
