"""A page reaches a person (blockstack_deploy/paging.py, alerts/templates/blockstack.tmpl): by e-mail
through a real mail server, and to Slack, PagerDuty, Opsgenie or a generic webhook as Alertmanager
itself renders them. The configuration is rendered by Stack.alertmanager_config(), as `make up`
and the Debian package render it; the tests shorten only the page route's group_interval (30 s in
production) so that a resolution goes out within seconds.

test_page_and_resolution_by_email: Debian's exim4 (its own configuration, spool and Maildir under
tmp_path, listening on a free 127.0.0.1 port), a real Prometheus evaluating the project's rules
(rendered with a short rate window and no keep_firing_for) on the series of the NVMe incident's
promtool case (alerts/tests/alerts.test.yml), served as their exporters would serve them, growing
at the case's rates, and a real Alertmanager. The collapse pages; the series stop growing (the
reads end) and it resolves. The test reads both mails as a person would (Subject, From, To, the
text body) and compares them with what the local receiver, the durable record, got: subject =
summary, the fix, the doctor command, the runbook, dashboard and Prometheus links, no label dump;
the resolution says RESOLVED after how long, from when to when. About 40 s.

test_chat_and_incident_payloads[SERVICE]: Alertmanager sends a one-alert page (the incident's
collapse) and a two-alert page (two of the pager's own failures on one host, one group), fed
through its API with the annotations the rules give them (the promtool cases' expectations), then
their resolutions, to a capture server on 127.0.0.1; each body is checked against the service's
documented schema (cited beside each check). About 15 s each.

test_unset_knobs_render_the_local_webhooks_alone, test_make_up_options_render_the_receivers: no
servers.
"""

import contextlib
import email
import email.policy
import http.server
import json
import mailbox
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
import yaml

from blockstack_deploy import paging
from blockstack_deploy.stack import REPO, SERVERS, Stack
from blockstack_lab.api import request
from blockstack_rules import knobs
from blockstack_testsupport import procs
from blockstack_testsupport.clock import wait_until
from page_receiver import received

ALERTS_TEST = os.path.join(REPO, "alerts", "tests", "alerts.test.yml")
INCIDENT = {"alertname": "BlockStackMergeCollapse", "host": "db1", "device": "nvme1n1"}
# Two of the pager's own pages on one host: one group of the page route (host, no device)
PAGER = ("BlockStackPagerDown", "BlockStackNotificationsFailing")
TO = "oncall@example.com"
# The rules as the test runs them: a 5 s rate window (1 s scrapes) so that stopped reads show
# within seconds, and a resolve as soon as the evidence ends (production keeps firing 90 s).
# (As test_pager.py writes its overrides: a knob is given a value in alerts/config.yml alone.)
SHORT = {
    **dict.fromkeys(("rate_window",), "5s"),
    **dict.fromkeys(("collapse_keep_firing_for",), "0s"),
}


# --------------------------------------------------------------------------- the promtool cases


def promtool_cases():
    with open(ALERTS_TEST) as f:
        return yaml.safe_load(f)["tests"]


def expected_alerts(alertname, **labels):
    """(labels, annotations) of every expectation of the promtool cases for this alert."""
    for case in promtool_cases():
        for check in case.get("alert_rule_test", []):
            if check["alertname"] != alertname:
                continue
            for alert in check.get("exp_alerts") or []:
                if all(alert["exp_labels"].get(k) == v for k, v in labels.items()):
                    yield (
                        {"alertname": alertname, **alert["exp_labels"]},
                        alert.get("exp_annotations", {}),
                    )


def incident_case():
    """The first promtool case in which the incident's collapse pages: its input series."""
    for case in promtool_cases():
        for check in case.get("alert_rule_test", []):
            if check["alertname"] == INCIDENT["alertname"] and any(
                a["exp_labels"].get("device") == INCIDENT["device"]
                for a in check.get("exp_alerts") or []
            ):
                return case
    raise AssertionError(f"no case of {ALERTS_TEST} pages {INCIDENT}")


class SeriesServer:
    """The input series of a promtool case as exporters would serve them: each `a+bxn` (or
    `a-bxn`, `axn`) series starts at a and grows by b every `interval` of real time, until
    stop() (the reads end: every counter stays where it is). Labels as written (job, instance,
    host: Prometheus scrapes it with honor_labels)."""

    def __init__(self, case):
        self.interval = parse_seconds(case.get("interval", "1m"))
        self.series = []
        for s in case["input_series"]:
            first = str(s["values"]).split()[0]
            m = re.fullmatch(
                r"(-?[0-9.]+(?:e[+-]?[0-9]+)?)(?:([+-])([0-9.]+(?:e[+-]?[0-9]+)?))?x[0-9]+", first
            )
            assert m, f"{s['series']}: values {first!r} not of the form a+bxn or axn"
            start, sign, step = m.groups()
            slope = float(step or 0) * (-1 if sign == "-" else 1)
            self.series.append((s["series"], float(start), slope))
        self.started = time.monotonic()
        self.stopped = None
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = server.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"

    def exposition(self):
        now = self.stopped or time.monotonic()
        steps = (now - self.started) / self.interval
        return "".join(f"{name} {start + slope * steps}\n" for name, start, slope in self.series)

    def stop(self):
        self.stopped = time.monotonic()

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def parse_seconds(text):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    m = re.fullmatch(r"([0-9.]+)(ms|s|m|h)", str(text))
    return float(m[1]) * units[m[2]]


# --------------------------------------------------------------------------- the stacks


class DeliveryStack(Stack):
    """The stack with the paging knobs, the page route's group_interval shortened, and for the
    e-mail test a Prometheus scraping the series server with the shortened rules."""

    def __init__(self, workdir, knobs_, components, fixture=None, servers=None):
        super().__init__(
            workdir,
            components=components,
            scrape_interval="1s",
            evaluation_interval="1s",
            servers=servers,
        )
        self.paging = knobs_
        self.fixture = fixture

    def alertmanager_config(self):
        config = super().alertmanager_config()
        for route in config["route"]["routes"]:
            if route["receiver"] == "page":
                route["group_interval"] = "2s"
        return config

    def prometheus_config(self):
        config = super().prometheus_config()
        rule_files = []
        for path, text in knobs.rule_files(knobs.load(), **SHORT).items():
            if path in knobs.HOST_RULES:
                rule_files.append(os.path.join(self.workdir, path.name))
                with open(rule_files[-1], "w") as f:
                    f.write(text)
        config["rule_files"] = rule_files
        if self.fixture:
            config["scrape_configs"].append(
                {
                    "job_name": "fixture",
                    "honor_labels": True,
                    "static_configs": [{"targets": [self.fixture]}],
                }
            )
        return config


# --------------------------------------------------------------------------- the mail server


EXIM_CONFIG = """\
# A private exim for one test: its own spool, mail taken from the SMTP user alone (as a
# smarthost takes it), every recipient delivered to one Maildir
exim_user = @UID@
exim_group = @UID@
primary_hostname = mail.test
spool_directory = @DIR@/spool
daemon_smtp_ports = @PORT@
local_interfaces = 127.0.0.1
tls_advertise_hosts =
keep_environment =
never_users =
domainlist local_domains = *
acl_smtp_rcpt = acl_check_rcpt

begin acl
acl_check_rcpt:
  accept authenticated = *
  deny message = authenticate first

begin routers
mailbox:
  driver = accept
  transport = maildir

begin transports
maildir:
  driver = appendfile
  directory = @DIR@/Maildir
  maildir_format
  create_directory
  envelope_to_add
  return_path_add

begin authenticators
plain:
  driver = plaintext
  public_name = PLAIN
  server_prompts = :
  server_condition = ${if and {{eq{$auth2}{@USER@}}{eq{$auth3}{@PASSWORD@}}}}
login:
  driver = plaintext
  public_name = LOGIN
  server_prompts = Username:: : Password::
  server_condition = ${if and {{eq{$auth1}{@USER@}}{eq{$auth2}{@PASSWORD@}}}}
"""
SMTP_USER, SMTP_PASSWORD = "pager", "s3cret-pw"
# exim delivers as a user other than root (uid 0 is in its compiled-in never_users) and the
# Maildir lies under pytest's 0700 directory: it runs in a user namespace of its own as uid 1000
# there, which is the test's user outside (root's files are its own, nothing more). root is not
# mapped, so exim4's setuid bit does nothing: it runs unprivileged from its start ("lost privilege
# for using -C option" in its log).
NS_UID = 1000


@contextlib.contextmanager
def mail_server(directory, log_path):
    """Debian's exim4 on a free 127.0.0.1 port delivering to directory/Maildir; yields (port,
    Maildir path). Stopped on exit, also on failure."""
    exim = shutil.which("exim4")
    if exim is None:
        pytest.fail("exim4 not found (make deps: exim4-daemon-light)", pytrace=False)
    os.makedirs(os.path.join(directory, "spool"), exist_ok=True)
    port = procs.free_port()
    conf = os.path.join(directory, "exim.conf")
    with open(conf, "w") as f:
        f.write(
            EXIM_CONFIG.replace("@UID@", str(NS_UID))
            .replace("@DIR@", directory)
            .replace("@PORT@", str(port))
            .replace("@USER@", SMTP_USER)
            .replace("@PASSWORD@", SMTP_PASSWORD)
        )
    argv = [
        "unshare",
        "--user",
        f"--map-user={NS_UID}",
        f"--map-group={NS_UID}",
        exim,
        "-C",
        conf,
        "-bdf",  # the daemon, in the foreground: procs.running stops its process group
        "-oX",
        f"127.0.0.1:{port}",
    ]
    with procs.running(argv, log_path=log_path) as proc:

        def listening():
            assert proc.poll() is None, f"exim exited {proc.returncode}: see {log_path}"
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                return s.recv(100).startswith(b"220")

        wait_until("exim's SMTP greeting", listening, 10, interval=0.1)
        yield port, os.path.join(directory, "Maildir")


def mails(maildir):
    """Every message delivered, parsed as a mail program does (.raw: the bytes in the Maildir)."""
    if not os.path.isdir(os.path.join(maildir, "new")):
        return []
    messages = []
    for raw in mailbox.Maildir(maildir, factory=None, create=False):
        message = email.message_from_bytes(raw.as_bytes(), policy=email.policy.default)
        message.raw = raw.as_bytes()
        messages.append(message)
    return messages


def text_body(message):
    return message.get_body(preferencelist=("plain",)).get_content()


def go_duration(seconds):
    """time.Duration's String() of a whole number of seconds: 58s, 4m13s, 1h2m3s."""
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return (f"{h}h" if h else "") + (f"{m}m" if h or m else "") + f"{s}s"


def rfc3339(text):
    """Unix seconds of Alertmanager's startsAt/endsAt (nanoseconds cut to microseconds)."""
    from datetime import datetime

    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def no_label_dump(text, labels):
    """Alertmanager's default templates print every label as name=value or a table of them (the
    links' own query strings aside)."""
    text = re.sub(r"https?://[^\s|>]+", "", text)
    assert "alertname" not in text, text
    for name, value in labels.items():
        assert f"{name}={value}" not in text and f"{name}: {value}" not in text, (name, text)


def fix_of(description):
    return re.sub(r"\.\s*$", "", description.split("Fix: ", 1)[1])


# --------------------------------------------------------------------------- e-mail


@pytest.mark.servers
def test_page_and_resolution_by_email(tmp_path):
    case = incident_case()
    with contextlib.ExitStack() as cleanup:
        port, maildir = cleanup.enter_context(
            mail_server(str(tmp_path / "mail"), tmp_path / "exim.log")
        )
        fixture = cleanup.enter_context(SeriesServer(case))
        secrets = tmp_path / "stack" / "secrets"
        secrets.mkdir(parents=True)
        (secrets / "smtp-password").write_text(SMTP_PASSWORD)  # printf %s: no final newline
        stack = DeliveryStack(
            tmp_path / "stack",
            paging.Paging(email=TO, smtp=f"{SMTP_USER}@127.0.0.1:{port}", secrets_dir=str(secrets)),
            components=("receiver", "alertmanager", "prometheus"),
            fixture=fixture.address,
        )
        missing = stack.missing()
        if missing:
            pytest.fail("missing prerequisites:\n  " + "\n  ".join(missing), pytrace=False)
        started = time.time()
        cleanup.enter_context(stack.running())

        def page(status):
            """(record, alert) of the incident's page at the local receiver (the durable record),
            and the mail of that notification: subject the summary, RESOLVED ... when resolved."""
            got = [
                (r, a)
                for r, a in received(stack.pages_file)
                if a["status"] == status
                and all(a["labels"].get(k) == v for k, v in INCIDENT.items())
            ]
            if not got:
                return None
            record, alert = got[0]
            summary = alert["annotations"]["summary"]
            for message in mails(maildir):
                subject = message["Subject"]
                if (status == "firing" and subject == summary) or (
                    status == "resolved"
                    and subject.startswith("RESOLVED after ")
                    and subject.endswith(f": {summary}")
                ):
                    return record, alert, message
            return None

        record, alert, firing = wait_until("the page's mail", lambda: page("firing"), 90)
        print(f"paged by mail {time.time() - started:.1f} s after the stack started")
        fixture.stop()  # the reads end
        stopped = time.time()
        _, resolved_alert, resolved = wait_until(
            "the resolution's mail", lambda: page("resolved"), 60
        )
        print(f"resolved by mail {time.time() - stopped:.1f} s after the reads ended")

    annotations = alert["annotations"]
    summary, description = annotations["summary"], annotations["description"]
    # A person's view: who it is from, to whom, the subject, the text.
    assert firing["Subject"] == summary
    assert firing["From"] == f"blockstack-merges@{stack.host}"
    assert firing["To"] == TO
    body = text_body(firing)
    lines = body.splitlines()
    assert lines[0] == summary
    facts = description.split(" Fix: ")[0]
    for sentence in re.split(r"(?<=[.:]) (?=[A-Z])", facts):
        assert sentence in lines, (sentence, body)  # the description's facts, one a line
    assert f"Fix:        {fix_of(description)}" in lines
    assert f"Check:      {annotations['doctor']}   (on {INCIDENT['host']})" in lines
    assert f"Runbook:    {annotations['runbook_url']}" in lines
    assert f"Dashboard:  {annotations['dashboard']}" in lines
    assert f"Prometheus: {alert['generatorURL']}" in lines
    assert alert["generatorURL"].startswith("http") and "/graph?g0.expr=" in alert["generatorURL"]
    no_label_dump(body, alert["labels"])
    assert record["notification"]["receiver"] == "page"

    # The resolution: what changed, when, and how long it lasted
    duration = go_duration(
        round(rfc3339(resolved_alert["endsAt"]) - rfc3339(resolved_alert["startsAt"]))
    )
    assert resolved["Subject"] == f"RESOLVED after {duration}: {summary}"
    rbody = text_body(resolved)
    rlines = rbody.splitlines()
    assert rlines[0] == f"RESOLVED after {duration}: {summary}"
    assert rlines[1].startswith("Fired from ") and rlines[1].endswith(
        ", when its rule stopped holding."
    )
    assert re.search(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC to \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", rlines[1]
    )
    assert "nothing is measured anew at resolve time" in rlines[2]
    assert f"Fix:        {fix_of(description)}" in rlines
    no_label_dump(rbody, alert["labels"])

    for name, message in (("firing", firing), ("resolved", resolved)):  # pytest -s shows them
        print(f"===== the e-mail as received ({name}), in {maildir}")
        print(message.raw.decode())
        print(f"===== its text body, as a mail program shows it ({name})")
        print(text_body(message))


# --------------------------------------------------------------------------- chat and incidents


class CaptureServer:
    """Records every request (method, path, headers, JSON body) and answers as the service does."""

    def __init__(self, status=200, answer=b"ok"):
        self.requests = []
        capture = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                capture.requests.append(
                    {
                        "method": "POST",
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": json.loads(body),
                    }
                )
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


PD_KEY = "0123456789abcdef0123456789abcdef"  # an Events API v2 integration key is 32 characters
GENIE_KEY = "eb243592-faa2-4ba2-a551q-1afdf565c889"
# Each service: what page-chat holds, PAGE_CHAT_URL, what the service answers.
SERVICES = {
    "slack": (lambda url: url + "services/T000/B000/XXXX", None, 200, b"ok"),
    "pagerduty": (lambda url: PD_KEY, lambda url: url + "v2/enqueue", 202, b'{"status":"success"}'),
    "opsgenie": (
        lambda url: GENIE_KEY,
        lambda url: url,
        202,
        b'{"result":"Request will be processed"}',
    ),
    "webhook": (lambda url: url + "hook", None, 200, b""),
}


PROMETHEUS = "http://127.0.0.1:9090"  # the external URL of the Prometheus the API-fed alerts name


def api_alerts():
    """The incident's collapse (a group of one) and two of the pager's own pages (a group of two),
    with the labels and annotations the rules give them in the promtool cases, links made absolute
    as Prometheus makes them ({{ $externalURL }}, which promtool leaves empty)."""
    alerts = [next(expected_alerts(INCIDENT["alertname"], device=INCIDENT["device"]))]
    alerts += [next(expected_alerts(name, host="db1")) for name in PAGER]
    return [
        {
            "labels": labels,
            "annotations": {
                k: PROMETHEUS + v if v.startswith("/") else v for k, v in annotations.items()
            },
            "generatorURL": f"{PROMETHEUS}/graph?g0.expr="
            + urllib.parse.quote(f'ALERTS{{alertname="{labels["alertname"]}"}}'),
        }
        for labels, annotations in alerts
    ]


@pytest.mark.servers
@pytest.mark.parametrize("servers", list(SERVERS))  # Alertmanager 0.25 (Debian's) and 0.31
@pytest.mark.parametrize("service", list(SERVICES))
def test_chat_and_incident_payloads(tmp_path, service, servers):
    secret, api_url, status, answer = SERVICES[service]
    with contextlib.ExitStack() as cleanup:
        capture = cleanup.enter_context(CaptureServer(status, answer))
        secrets = tmp_path / "stack" / "secrets"
        secrets.mkdir(parents=True)
        # as `echo` writes it, but the Opsgenie key (Alertmanager 0.25 sends it verbatim: paging.py)
        newline = "" if service == "opsgenie" else "\n"
        (secrets / "page-chat").write_text(secret(capture.url) + newline)
        stack = DeliveryStack(
            tmp_path / "stack",
            paging.Paging(
                chat=service,
                chat_url=api_url(capture.url) if api_url else "",
                secrets_dir=str(secrets),
            ),
            components=("receiver", "alertmanager"),
            servers=servers,
        )
        missing = stack.missing()
        if missing:
            pytest.fail("missing prerequisites:\n  " + "\n  ".join(missing), pytrace=False)
        cleanup.enter_context(stack.running())
        alerts = api_alerts()
        post = stack.url("alertmanager", "/api/v2/alerts")
        assert request(post, body=alerts)[0] == 200
        wait_until("both groups' notifications", lambda: len(capture.requests) >= 2, 30, 0.2)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        assert request(post, body=[{**a, "endsAt": now} for a in alerts])[0] == 200
        wait_until("both groups' resolutions", lambda: len(capture.requests) >= 4, 30, 0.2)
        time.sleep(1)  # nothing more may come (a label dump sent twice would show here)
        sent = list(capture.requests)

    assert len(sent) == 4, [r["path"] for r in sent]
    firing, resolving = sent[:2], sent[2:]
    one = next(r for r in firing if INCIDENT["device"] in json.dumps(r["body"]))  # the collapse
    two = next(r for r in firing if r is not one)  # the pager's two failures
    collapse = alerts[0]
    CHECKS[service](one, two, resolving, collapse, alerts[1:])
    # pytest -s shows what the service receives
    print(f"===== {service}: the collapse's page as Alertmanager sent it: POST {one['path']}")
    print(json.dumps(one["body"], indent=2))
    for r in resolving:
        print(f"===== {service}: a resolution: POST {r['path']}")
        print(json.dumps(r["body"], indent=2))


def check_slack(one, two, resolving, collapse, pager):
    # https://api.slack.com/messaging/webhooks and https://api.slack.com/reference/messaging/payload:
    # a message has text, blocks or attachments; https://api.slack.com/reference/messaging/attachments:
    # each attachment's fallback is "a plain-text summary of the attachment" (no markup), its color
    # good, warning, danger or a hex colour; text is mrkdwn, where &, < and > must be escaped
    # (https://api.slack.com/reference/surfaces/formatting#escaping) except as link delimiters.
    a = collapse["annotations"]
    for r in (one, two, *resolving):
        body = r["body"]
        assert body.get("text") or body.get("blocks") or body.get("attachments"), body
        (att,) = body["attachments"]
        assert att["fallback"] and "*" not in att["fallback"] and "<" not in att["fallback"]
        assert att["fallback"] == att["title"]
        assert re.fullmatch(r"good|warning|danger|#[0-9a-fA-F]{6}", att["color"]), att["color"]
        unlinked = re.sub(r"<https?://[^|>\s]+\|[^>]+>", "", att["text"])
        assert "<" not in unlinked and ">" not in unlinked, att["text"]
        assert not re.search(r"&(?!amp;|lt;|gt;)", unlinked), att["text"]
    att = one["body"]["attachments"][0]
    assert att["title"] == a["summary"] and att["color"] == "danger"
    assert att["title_link"] == a["dashboard"]
    text = att["text"]
    assert f"*Fix:* `{fix_of(a['description']).replace('>', '&gt;')}`" in text
    assert f"*Check:* `{a['doctor']}`" in text
    for url, name in (
        (a["runbook_url"], "Runbook"),
        (a["dashboard"], "Dashboard"),
        (collapse["generatorURL"], "Prometheus"),
    ):
        assert f"<{url}|{name}>" in text
    no_label_dump(text, collapse["labels"])
    att2 = two["body"]["attachments"][0]
    assert att2["title"].endswith(" (+1 more)")
    for alert in pager:  # one section each, led by its summary in bold
        assert f"*{alert['annotations']['summary']}*" in att2["text"]
    for r in resolving:
        att = r["body"]["attachments"][0]
        assert att["color"] == "good" and att["title"].startswith("RESOLVED after ")
        assert "Fired from " in att["text"]


def check_pagerduty(one, two, resolving, collapse, pager):
    # https://developer.pagerduty.com/docs/events-API-v2/trigger-events (PagerDuty/developer-docs
    # docs/events-API-v2/02-Trigger-Events.md): routing_key (the 32-character integration key),
    # event_action trigger, acknowledge or resolve, dedup_key at most 255 characters,
    # payload.summary at most 1024 characters, payload.source, payload.severity critical, error,
    # warning or info; links [{href, text}].
    a = collapse["annotations"]
    for r in (one, two, *resolving):
        body = r["body"]
        assert r["path"] == "/v2/enqueue" and r["headers"]["Content-Type"] == "application/json"
        assert body["routing_key"] == PD_KEY and len(body["routing_key"]) == 32
        assert body["event_action"] in ("trigger", "acknowledge", "resolve")
        assert 0 < len(body["dedup_key"]) <= 255
        payload = body["payload"]
        assert 0 < len(payload["summary"]) <= 1024
        assert payload["source"]
        assert payload["severity"] in ("critical", "error", "warning", "info")
        for link in body.get("links", []):
            assert link["href"].startswith("http") and isinstance(link["text"], str)
        for value in payload.get("custom_details", {}).values():  # 0.31 sends counts as numbers
            if isinstance(value, str):
                no_label_dump(value, collapse["labels"])
    body = one["body"]
    assert body["event_action"] == "trigger"
    assert body["payload"]["summary"] == a["summary"]
    assert body["payload"]["severity"] == "critical" and body["payload"]["source"] == "db1"
    assert [(link["text"], link["href"]) for link in body["links"]] == [
        ("Runbook", a["runbook_url"]),
        ("Dashboard", a["dashboard"]),
        ("Prometheus", collapse["generatorURL"]),
    ]
    details = body["payload"]["custom_details"]["firing"]
    assert details.splitlines()[0] == a["summary"]
    assert f"Fix:        {fix_of(a['description'])}" in details and a["doctor"] in details
    assert two["body"]["payload"]["summary"].endswith(" (+1 more)")
    for alert in pager:
        assert alert["annotations"]["summary"] in two["body"]["payload"]["custom_details"]["firing"]
    assert sorted(r["body"]["dedup_key"] for r in resolving) == sorted(
        r["body"]["dedup_key"] for r in (one, two)
    )
    for r in resolving:
        assert r["body"]["event_action"] == "resolve"
        assert r["body"]["payload"]["summary"].startswith("RESOLVED after ")
        assert "RESOLVED after " in r["body"]["payload"]["custom_details"]["resolved"]


def check_opsgenie(one, two, resolving, collapse, pager):
    # https://docs.opsgenie.com/docs/alert-api (create alert): POST /v2/alerts with header
    # Authorization: GenieKey KEY; message required, at most 130 characters; alias at most 512;
    # description at most 15000; source at most 100; priority P1 to P5; at most 20 tags of at most
    # 50 characters; details string to string. Close alert: POST
    # /v2/alerts/IDENTIFIER/close?identifierType=alias.
    a = collapse["annotations"]
    for r in (one, two):
        body = r["body"]
        assert (
            r["path"] == "/v2/alerts" and r["headers"]["Authorization"] == f"GenieKey {GENIE_KEY}"
        )
        assert 0 < len(body["message"]) <= 130
        assert 0 < len(body["alias"]) <= 512
        assert len(body["description"]) <= 15000
        assert len(body["source"]) <= 100
        assert body["priority"] in ("P1", "P2", "P3", "P4", "P5")
        assert len(body["tags"]) <= 20 and all(len(t) <= 50 for t in body["tags"])
        assert all(isinstance(v, str) for v in body["details"].values())
        no_label_dump(body["description"], collapse["labels"])
    body = one["body"]
    assert body["message"] == a["summary"][:130] and body["priority"] == "P1"
    assert body["description"].splitlines()[0] == a["summary"]
    assert f"Fix:        {fix_of(a['description'])}" in body["description"]
    assert a["doctor"] in body["description"] and a["runbook_url"] in body["description"]
    for alert in pager:
        assert alert["annotations"]["summary"] in two["body"]["description"]
    closed = sorted(urllib.parse.urlsplit(r["path"]) for r in resolving)
    assert sorted(
        (f"/v2/alerts/{r['body']['alias']}/close", "identifierType=alias") for r in (one, two)
    ) == [(c.path, c.query) for c in closed]
    for r in resolving:
        assert r["headers"]["Authorization"] == f"GenieKey {GENIE_KEY}"


def check_webhook(one, two, resolving, collapse, pager):
    # Alertmanager's own JSON (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config):
    # version "4", groupKey, truncatedAlerts, status, receiver, groupLabels, commonLabels,
    # commonAnnotations, externalURL, alerts [{status, labels, annotations, startsAt, endsAt,
    # generatorURL, fingerprint}]. No template applies: its reader renders it.
    keys = {
        "version",
        "groupKey",
        "truncatedAlerts",
        "status",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    }
    alert_keys = {
        "status",
        "labels",
        "annotations",
        "startsAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
    }
    for r, status in ((one, "firing"), (two, "firing"), *((r, "resolved") for r in resolving)):
        body = r["body"]
        assert r["path"] == "/hook" and keys <= set(body) and body["version"] == "4"
        assert body["status"] == status and body["receiver"] == "page"
        for alert in body["alerts"]:
            assert alert_keys <= set(alert) and alert["status"] == status
    (alert,) = one["body"]["alerts"]
    assert alert["annotations"] == collapse["annotations"]
    assert alert["generatorURL"] == collapse["generatorURL"]
    assert len(two["body"]["alerts"]) == 2


CHECKS = {
    "slack": check_slack,
    "pagerduty": check_pagerduty,
    "opsgenie": check_opsgenie,
    "webhook": check_webhook,
}


# --------------------------------------------------------------------------- no knobs


def test_unset_knobs_render_the_local_webhooks_alone(tmp_path):
    """Without a paging knob the receivers are the local webhooks of alerts/alertmanager.yml alone;
    with them, e-mail and the service come beside the local webhook of `page` and `ticket` only."""
    with open(os.path.join(REPO, "alerts", "alertmanager.yml")) as f:
        source = {r["name"]: r for r in yaml.safe_load(f)["receivers"]}
    plain = Stack(tmp_path / "plain", components=("receiver", "alertmanager"))
    assert not plain.paging
    rendered = {r["name"]: r for r in plain.alertmanager_config()["receivers"]}
    assert {n: set(r) for n, r in rendered.items()} == {n: set(r) for n, r in source.items()}
    for name, receiver in rendered.items():
        assert [h["url"].rsplit("/", 1)[1] for h in receiver.get("webhook_configs", [])] == [
            h["url"].rsplit("/", 1)[1]
            for h in source[name].get("webhook_configs", [])
            if not h["url"].startswith("http://127.0.0.1:9467")  # receiver-self not run here
        ]

    # the same stack with e-mail and PagerDuty
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "page-chat").write_text(PD_KEY + "\n")
    paged = plain
    paged.paging = paging.Paging(email=TO, chat="pagerduty", secrets_dir=str(secrets))
    receivers = {r["name"]: r for r in paged.alertmanager_config()["receivers"]}
    for name in ("page", "ticket"):
        assert receivers[name]["webhook_configs"] == rendered[name]["webhook_configs"]
        assert receivers[name]["email_configs"][0]["to"] == TO
        (pd,) = receivers[name]["pagerduty_configs"]
        assert pd["routing_key_file"] == str(secrets / "page-chat")
        assert pd["severity"] == {"page": "critical", "ticket": "warning"}[name]
    assert receivers["deadmansswitch"] == rendered["deadmansswitch"]
    assert receivers["pagerself"] == rendered["pagerself"]

    # a secret the knobs need but no file holds: the render says which file to write
    (secrets / "page-chat").unlink()
    with pytest.raises(SystemExit, match="write the Events API v2 integration"):
        paged.alertmanager_config()
    # Alertmanager 0.25 sends the SMTP password and the Opsgenie key with a final newline (the
    # e-mail test's server refused "s3cret-pw\n"): the render refuses such a file
    (secrets / "page-chat").write_text(GENIE_KEY + "\n")
    (secrets / "smtp-password").write_text(SMTP_PASSWORD + "\n")
    paged.paging = paging.Paging(
        email=TO,
        smtp=f"{SMTP_USER}@smtp.example.com:587",
        chat="opsgenie",
        secrets_dir=str(secrets),
    )
    with pytest.raises(SystemExit) as refused:
        paged.alertmanager_config()
    assert str(refused.value).count("ends in a newline") == 2, refused.value
    (secrets / "page-chat").write_text(GENIE_KEY)
    (secrets / "smtp-password").write_text(SMTP_PASSWORD)
    receivers = {r["name"]: r for r in paged.alertmanager_config()["receivers"]}
    assert receivers["page"]["email_configs"][0]["require_tls"]  # not on loopback
    assert receivers["page"]["email_configs"][0]["auth_username"] == SMTP_USER


def test_make_up_options_render_the_receivers(tmp_path):
    """stackctl.py's options (`make up UP_ARGS=...`) reach Alertmanager's receivers; a missing
    secret is an error naming its file."""
    state = tmp_path / "state"

    def render(*args):
        return subprocess.run(
            [sys.executable, os.path.join(REPO, "deploy", "stackctl.py"), "--state", str(state)]
            + ["render", "--page-email", TO, "--page-chat", "pagerduty", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = render()
    assert r.returncode != 0 and f"to {state}/secrets/page-chat" in r.stderr + r.stdout, r
    (state / "secrets").mkdir(parents=True, exist_ok=True)
    (state / "secrets" / "page-chat").write_text(PD_KEY + "\n")
    r = render("--smtp", "smtp.example.com:587")
    assert r.returncode == 0, r.stderr
    with open(state / "config" / "alertmanager.yml") as f:
        receivers = {r["name"]: r for r in yaml.safe_load(f)["receivers"]}
    (email,) = receivers["page"]["email_configs"]
    assert (email["to"], email["smarthost"], email["require_tls"]) == (
        TO,
        "smtp.example.com:587",
        True,
    )
    assert receivers["ticket"]["pagerduty_configs"][0]["severity"] == "warning"
