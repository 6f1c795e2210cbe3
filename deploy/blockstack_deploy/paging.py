"""Paging a person: e-mail and one chat or incident service (Slack, PagerDuty, Opsgenie or a
generic webhook), rendered into Alertmanager's `page` and `ticket` receivers beside the local
page receiver, which stays the durable record (Stack.alertmanager_config). The text is ours,
alerts/templates/blockstack.tmpl: the summary first, then the facts, the fix, the doctor command
and the links; no label dumps. Nothing set: the receivers are the local webhooks alone, as before.

The knobs (stackctl.py's options, the Debian package's blockstack-merges.conf):

    --page-email ADDR[,ADDR]   PAGE_EMAIL       mail every page and ticket to these addresses
    --page-email-from ADDR     PAGE_EMAIL_FROM  the sender (default blockstack-merges@HOST, the
                                                host's name: the MTA may qualify it)
    --smtp [USER@]HOST:PORT    SMTP             the mail server (default localhost:25: the
                                                host's own MTA, which relays as it is set up to)
    --page-chat SERVICE        PAGE_CHAT        slack, pagerduty, opsgenie or webhook
    --page-chat-url URL        PAGE_CHAT_URL    the service's API when not its default (Opsgenie's
                                                EU https://api.eu.opsgenie.com/, PagerDuty's EU
                                                https://events.eu.pagerduty.com/v2/enqueue)

Secrets are files in the state's secrets directory, which the operator writes (0640, group
blockstack: privileges.apply), never options:

    smtp-password  the SMTP USER's password      email_configs auth_password_file
    page-chat      slack: the incoming webhook's URL         slack_configs api_url_file
                   pagerduty: the Events API v2 routing key  pagerduty_configs routing_key_file
                   opsgenie: the API integration's key       opsgenie_configs api_key_file
                   webhook: the URL                          webhook_configs url: Alertmanager
                       0.25 has no url_file (0.26 has), so the URL is read here and written into
                       alertmanager.yml, which is then written 0600 (secret_in_config)

Alertmanager 0.25 reads the *_file fields at each notification: a key replaced in its file is
used from the next notification on, with no restart. It sends smtp-password and the Opsgenie key
as the file holds them, a final newline too (the mail server then refuses the password, Go's HTTP
client the header): write them with `printf %s`, not `echo`; the render refuses them otherwise.
"""

import dataclasses
import os

CHAT_SERVICES = ("slack", "pagerduty", "opsgenie", "webhook")
SMTP_DEFAULT = "localhost:25"
LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")
# What each receiver is: PagerDuty's payload.severity (critical, error, warning or info) and
# Opsgenie's priority (P1 highest .. P5) for a page and for a ticket; Slack's bar colour while
# firing.
LEVELS = {
    "page": {"severity": "critical", "priority": "P1", "color": "danger"},
    "ticket": {"severity": "warning", "priority": "P3", "color": "warning"},
}
# The templates of alerts/templates/blockstack.tmpl each field is rendered with.
TITLE = '{{ template "blockstack.title" . }}'
TEXT = '{{ template "blockstack.text" . }}'
FIRST_ALERT = "{{ with index .Alerts 0 }}%s{{ end }}"  # a field of the notification's first alert
HOST = '{{ or .CommonLabels.host "blockstack-merges" }}'


@dataclasses.dataclass
class Paging:
    """The paging knobs of one stack; secrets_dir holds smtp-password and page-chat."""

    email: str = ""
    email_from: str = ""
    smtp: str = SMTP_DEFAULT
    chat: str = ""
    chat_url: str = ""
    secrets_dir: str = ""

    @property
    def smtp_password_file(self):
        return os.path.join(self.secrets_dir, "smtp-password")

    @property
    def chat_secret_file(self):
        return os.path.join(self.secrets_dir, "page-chat")

    @property
    def secret_in_config(self):
        """Whether the rendered alertmanager.yml holds a secret (the webhook's URL)."""
        return self.chat == "webhook"

    def __bool__(self):
        return bool(self.email or self.chat)

    def problems(self):
        """What keeps these knobs from working, each saying what to do."""
        problems = []
        if self.email and "@" not in self.email:
            problems.append(f"page e-mail {self.email!r}: expected ADDR@DOMAIN[,ADDR@DOMAIN]")
        user, host, port = self.smtp_parts()
        if self.email and not (host and port.isdigit()):
            problems.append(f"SMTP {self.smtp!r}: expected [USER@]HOST:PORT")
        if self.email and user:
            problems += verbatim(self.smtp_password_file, f"SMTP user {user}", "the password")
        if self.chat and self.chat not in CHAT_SERVICES:
            problems.append(f"page chat {self.chat!r}: expected one of {', '.join(CHAT_SERVICES)}")
        elif self.chat:
            what = {
                "slack": "the incoming webhook's URL",
                "pagerduty": "the Events API v2 integration (routing) key",
                "opsgenie": "the API integration's key",
                "webhook": "the URL",
            }[self.chat]
            if self.chat == "opsgenie":
                problems += verbatim(self.chat_secret_file, "page chat opsgenie", what)
            elif not os.path.exists(self.chat_secret_file):
                problems.append(f"page chat {self.chat}: write {what} to {self.chat_secret_file}")
        return problems

    def smtp_parts(self):
        """(user, host, port) of `[USER@]HOST:PORT` (a user may hold an @ itself)."""
        user, _, hostport = self.smtp.rpartition("@")
        host, _, port = hostport.rpartition(":")
        return user, host, port

    def integrations(self, receiver, host):
        """{"email_configs": [...], "slack_configs": [...], ...} to add to the receiver `page` or
        `ticket` of the stack on `host`."""
        problems = self.problems()
        if problems:
            raise SystemExit("paging: " + "; ".join(problems))
        level = LEVELS[receiver]
        out = {}
        if self.email:
            out["email_configs"] = [self._email(host)]
        if self.chat:
            out[f"{self.chat}_configs"] = [getattr(self, "_" + self.chat)(level)]
        return out

    def _email(self, host):
        user, smtp_host, _ = self.smtp_parts()
        email = {
            "to": self.email,
            "from": self.email_from or f"blockstack-merges@{host}",
            "smarthost": self.smtp.rpartition("@")[2],
            "hello": host,
            # Alertmanager refuses an SMTP server without STARTTLS unless told; the host's own
            # MTA on loopback is the one place plain SMTP is fine (port 465 is TLS from the start)
            "require_tls": smtp_host not in LOOPBACK,
            "send_resolved": True,
            "headers": {"Subject": TITLE},
            "text": '{{ template "blockstack.email.text" . }}',
            "html": "",  # no HTML part: Alertmanager's default one is a table of every label
        }
        if user:
            email |= {"auth_username": user, "auth_password_file": self.smtp_password_file}
        return email

    def _slack(self, level):
        # https://api.slack.com/reference/messaging/attachments: title, fallback (the plain-text
        # line a notification shows), text (mrkdwn), color
        return {
            "api_url_file": self.chat_secret_file,
            "send_resolved": True,
            "title": TITLE,
            "title_link": FIRST_ALERT % "{{ or .Annotations.dashboard .Annotations.runbook_url }}",
            "fallback": TITLE,
            "text": '{{ template "blockstack.slack.text" . }}',
            "color": '{{ if eq .Status "resolved" }}good{{ else }}%s{{ end }}' % level["color"],
        }

    def _pagerduty(self, level):
        # https://developer.pagerduty.com/docs/events-API-v2/trigger-events: payload.summary (our
        # description), source, severity, component, class, custom_details, links
        config = {
            "routing_key_file": self.chat_secret_file,
            "send_resolved": True,
            "description": TITLE,
            "severity": level["severity"],
            "source": HOST,
            "component": "{{ .CommonLabels.device }}",
            "class": "{{ .CommonLabels.alertname }}",
            "client": "Block Stack Merges",
            # Alertmanager's defaults of `firing` and `resolved` list every label of every alert
            "details": {
                "firing": '{{ template "blockstack.text.alerts" .Alerts.Firing }}',
                "resolved": '{{ template "blockstack.text.alerts" .Alerts.Resolved }}',
                "num_firing": "{{ .Alerts.Firing | len }}",
                "num_resolved": "{{ .Alerts.Resolved | len }}",
            },
            "links": [
                {"href": FIRST_ALERT % "{{ .Annotations.runbook_url }}", "text": "Runbook"},
                {"href": FIRST_ALERT % "{{ .Annotations.dashboard }}", "text": "Dashboard"},
                {"href": FIRST_ALERT % "{{ .GeneratorURL }}", "text": "Prometheus"},
            ],
        }
        if self.chat_url:
            config["url"] = self.chat_url
        return config

    def _opsgenie(self, level):
        # https://docs.opsgenie.com/docs/alert-api: message (<= 130 characters, Alertmanager
        # cuts it), description (<= 15000), source, priority, tags; Alertmanager adds the common
        # labels as details and closes the alert by its alias when the group resolves
        config = {
            "api_key_file": self.chat_secret_file,
            "send_resolved": True,
            "message": TITLE,
            "description": TEXT,
            "source": HOST,
            "priority": level["priority"],
            "tags": "blockstack-merges,{{ .CommonLabels.alertname }}",
        }
        if self.chat_url:
            config["api_url"] = self.chat_url
        return config

    def _webhook(self, level):
        with open(self.chat_secret_file) as f:
            url = f.read().strip()
        # Alertmanager's own JSON (version 4): labels and annotations for a program to render
        return {"url": url, "send_resolved": True, "max_alerts": 100}


def verbatim(path, knob, what):
    """The problems of a secret file Alertmanager 0.25 sends as it is: missing, or ending in a
    newline."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return [f"{knob}: write {what} to {path} (printf %s SECRET > {path})"]
    if text != text.rstrip():
        return [
            f"{knob}: {path} ends in a newline, which Alertmanager 0.25 would send as part of "
            f"{what}: printf %s SECRET > {path}"
        ]
    return []
