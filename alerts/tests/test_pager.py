"""The pager watching itself, each failure caused for real (group blockstack-pager of
alerts/alerts.rules.yml, alerts/alertmanager.yml's `deadmansswitch` and `pagerself` routes):
blockstack-exporter, ebpf_exporter, the page receiver, the second notifier (receiver-self),
Alertmanager and Prometheus (blockstack_deploy.stack, Debian's servers) on free 127.0.0.1 ports,
the page receiver's files on a 1 MiB tmpfs, and the stand-in for an off-host dead man's switch
(alerts/receiver/dead_mans_switch.py) that the receiver pings after each heartbeat it wrote.

From the start: a webhook on a closed port (BlockStackNotificationsFailing) and a second
Alertmanager target that is down (BlockStackPagerDown). Then, one after the other, each fault
injected and who is told, after how many seconds (the Robustness table of BENCHMARKS.md, printed):

    a rule failing evaluation (rules reloaded) -> BlockStackRuleEvaluationFailing, second notifier
    a bad prometheus.yml reloaded (SIGHUP)     -> BlockStackPrometheusBadConfig, second notifier
    a bad alertmanager.yml reloaded (SIGHUP)   -> BlockStackAlertmanagerBadConfig, second notifier
    ebpf_exporter stopped                      -> BlockStackEvidenceExporterDown, page receiver
    the page receiver's tmpfs filled           -> heartbeat 503: the switch pages; BlockStackReceiver-
                                                  WriteFailing, -PagerDiskFilling, -HeartbeatStale
                                                  to the second notifier; space freed: the retried
                                                  page written, the switch resolves
    the page receiver stopped                  -> the switch; BlockStackPagerDown, second notifier
    Alertmanager stopped                       -> the switch only
    Prometheus stopped                         -> the switch only

Shortened for the test (production in parentheses): the watchdog's group_interval 5 s and
repeat_interval 4 s (1m and 50s), the switch's timeout 30 s (healthchecks.io: period 1 min + grace),
`for:` of the down, disk, bad-config and evidence alerts 5-10 s (1m, 5m, 5m, 3m), the heartbeat
stale after 30 s (300 s), the pager routes' group_interval 5 s (30 s). Every process and the mount
are removed on exit; about 5 minutes.
"""

import contextlib
import os
import signal
import time

import abuse  # alerts/tests/abuse.py: the stand-in switch
import pytest
import yaml

from blockstack_deploy.stack import Stack
from blockstack_lab import loop
from blockstack_lab.api import Prometheus
from blockstack_rules import knobs
from blockstack_testsupport import procs
from page_receiver import received

pytestmark = [pytest.mark.root, pytest.mark.servers]

SWITCH_TIMEOUT = 30  # seconds without a ping before the stand-in switch pages
WAIT = 120  # seconds at most for any one notification
RESEND_DELAY = (
    "5s"  # Prometheus's --rules.alert.resend-delay (the stack's: stack.RESEND_DELAY, 15 s)
)
SHORT = {
    **dict.fromkeys(("pager_down_for", "pager_disk_for", "pager_bad_config_for"), "5s"),
    **dict.fromkeys(("evidence_exporter_down_for",), "10s"),
    **dict.fromkeys(("heartbeat_stale_seconds",), 30),
}
BROKEN_RULES = {
    "groups": [
        {
            "name": "broken",
            "rules": [
                # many-to-many: several `up` series per host on both sides; fails every evaluation
                {"record": "host:up:broken", "expr": "up * on (host) up"}
            ],
        }
    ]
}
UNREACHABLE = {
    "groups": [
        {
            "name": "unreachable",
            "rules": [
                # always firing, routed to a receiver nobody listens on
                {
                    "alert": "PagerTestUnreachable",
                    "expr": "vector(1)",
                    "labels": {"severity": "warning", "route": "unreachable"},
                }
            ],
        }
    ]
}


class PagerStack(Stack):
    """The stack with the test's knobs and rules, an unreachable webhook and Alertmanager target,
    and Alertmanager's pager routes shortened."""

    def __init__(self, workdir, data_dir, closed_port):
        super().__init__(
            workdir,
            components=(
                "blockstack",
                "ebpf",
                "receiver",
                "receiver-self",
                "alertmanager",
                "prometheus",
            ),
            data_dir=data_dir,
        )
        self.closed = f"127.0.0.1:{closed_port}"
        self.extra_rules = os.path.join(data_dir, "extra.rules.yml")

    def prometheus_config(self):
        config = super().prometheus_config()
        rules = os.path.join(self.data_dir, "alerts.rules.yml")
        with open(rules, "w") as f:
            f.write(knobs.rule_files(knobs.load(), **SHORT)[knobs.HOST_RULES[0]])
        if not os.path.exists(self.extra_rules):
            self.write_extra_rules(UNREACHABLE)
        config["rule_files"] = [rules, self.extra_rules]
        for job in config["scrape_configs"]:
            if job["job_name"] == "alertmanager":
                job["static_configs"].append(
                    {"targets": [self.closed], "labels": {"host": self.host}}
                )
        return config

    def write_extra_rules(self, rules):
        with open(self.extra_rules, "w") as f:
            yaml.safe_dump(rules, f)

    def alertmanager_config(self):
        config = super().alertmanager_config()
        for route in config["route"]["routes"]:
            if route["receiver"] in ("deadmansswitch", "pagerself", "page"):
                route.update(
                    group_interval="5s",
                    **({"repeat_interval": "4s"} if route["receiver"] == "deadmansswitch" else {}),
                )
        config["route"]["routes"].insert(
            0,
            {
                "matchers": ['route="unreachable"'],
                "receiver": "unreachable",
                "group_wait": "0s",
                "group_interval": "5s",
            },
        )
        config["receivers"].append(
            {"name": "unreachable", "webhook_configs": [{"url": f"http://{self.closed}/page"}]}
        )
        return config

    def commands(self):
        # Prometheus sends firing alerts valid for 4 resend delays (the stack's 15 s): Alertmanager
        # goes on sending the watchdog that long after Prometheus died
        cmds = super().commands()
        argv, env, health = cmds["prometheus"]
        argv = [a for a in argv if not a.startswith("--rules.alert.resend-delay=")]
        cmds["prometheus"] = ([*argv, f"--rules.alert.resend-delay={RESEND_DELAY}"], env, health)
        return cmds


class Processes:
    """The stack's processes by component, each stoppable and restartable; all stopped on exit."""

    def __init__(self, stack, log_dir):
        self.commands, self.log_dir = stack.commands(), log_dir
        self.running = {}  # component -> (ExitStack, process)

    def start(self, name):
        argv, env, health = self.commands[name]
        es = contextlib.ExitStack()
        proc = es.enter_context(
            procs.running(
                argv,
                env=env,
                health_url=health,
                timeout=90,
                log_path=os.path.join(self.log_dir, f"{name}.log"),
            )
        )
        self.running[name] = (es, proc)

    def stop(self, name):
        self.running.pop(name)[0].close()

    def reload(self, name):
        os.kill(self.running[name][1].pid, signal.SIGHUP)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for name in reversed(list(self.running)):
            self.stop(name)


def reload_successfully(processes, stack, server):
    """SIGHUP Prometheus or Alertmanager and wait until it has loaded its configuration (a second
    SIGHUP while one is handled can be lost, Go delivers signals to a channel of one)."""

    def loaded():
        text = procs.http_get(stack.url(server, "/metrics"))
        return float(
            next(
                line.split()[1]
                for line in text.splitlines()
                if line.startswith(f"{server}_config_last_reload_success_timestamp_seconds ")
            )
        )

    before = loaded()
    time.sleep(1.1)  # the timestamp counts seconds
    processes.reload(server)
    procs.wait_until(f"{server} reloaded", lambda: loaded() > before, 30, 0.2)


def told(path, alertname, since, **labels):
    """The receiver time of the first firing notification of alertname (with these labels) in the
    file of a page receiver since `since`, or None."""
    return next(
        (
            r["received_at"]
            for r, a in received(path, since)
            if a["labels"].get("alertname") == alertname
            and a["status"] == "firing"
            and all(a["labels"].get(k) == v for k, v in labels.items())
        ),
        None,
    )


def switch_paged(events, since, state="down"):
    return next(
        (e["at"] for e in abuse.switch_events(events) if e["state"] == state and e["at"] >= since),
        None,
    )


def test_each_step_of_a_page_failing_is_told(tmp_path):
    if os.geteuid() != 0:
        pytest.fail(
            "not root: this test mounts a tmpfs and loads BPF programs (sudo make test)",
            pytrace=False,
        )
    table = []  # (fault, who was told, through which path, seconds)

    def row(fault, who, path, t0, at):
        table.append((fault, who, path, at - t0))
        print(f"{fault}: {who} after {at - t0:.0f} s")

    with contextlib.ExitStack() as cleanup:
        mnt = cleanup.enter_context(
            loop.mounted("tmpfs", "size=1m", fstype="tmpfs", directory=tmp_path)
        )
        for d in ("data", "logs", "self-pages"):
            (tmp_path / d).mkdir()
        url, url_file, switch_port, events = cleanup.enter_context(
            abuse.dead_mans_switch(tmp_path / "switch", SWITCH_TIMEOUT)
        )
        stack = PagerStack(mnt, str(tmp_path / "data"), procs.free_port())
        stack.self_pages_file = str(tmp_path / "self-pages" / "pages.jsonl")
        stack.heartbeat_url_file = url_file
        missing = stack.missing()
        if missing:
            pytest.fail("missing prerequisites:\n  " + "\n  ".join(missing), pytrace=False)
        stack.render()
        if not stack.runs_ebpf:
            pytest.fail(
                "no BPF program loads on this kernel: the ebpf_exporter fault needs one",
                pytrace=False,
            )
        processes = cleanup.enter_context(Processes(stack, str(tmp_path / "logs")))
        for name in stack.commands():
            processes.start(name)
        start = time.time()
        prometheus = Prometheus(stack.url("prometheus"))
        pages, selfpages = stack.pages_file, stack.self_pages_file

        # Healthy: the heartbeat reaches the switch; the faults present from the start are told.
        procs.wait_until(
            "the first ping at the switch", lambda: abuse.switch_status(switch_port)["pings"], WAIT
        )
        first_ping = time.time()
        row(
            "(none: the heartbeat)",
            "dead man's switch (stand-in)",
            "rule -> Alertmanager -> receiver's durable write -> ping",
            start,
            first_ping,
        )
        for alertname, labels in (
            ("BlockStackPagerDown", {"instance": stack.closed}),
            ("BlockStackNotificationsFailing", {"integration": "webhook"}),
        ):
            at = procs.wait_until(
                f"{alertname} at the second notifier",
                lambda: told(selfpages, alertname, 0, **labels),
                WAIT,
            )
            assert procs.wait_until(
                f"{alertname} paged", lambda: told(pages, alertname, 0, **labels), WAIT
            )
            row(
                {
                    "BlockStackPagerDown": "a pager server unscrapable (a second Alertmanager target)",
                    "BlockStackNotificationsFailing": "a webhook unreachable",
                }[alertname],
                f"second notifier ({alertname}) and the page receiver",
                "Prometheus -> Alertmanager -> receiver-self",
                start,
                at,
            )
        # a heartbeat every group_interval (5 s; 1 min in production): 5 more within 30 s
        pings, counted_from = abuse.switch_status(switch_port)["pings"], time.monotonic()
        procs.wait_until(
            "5 more heartbeats at the switch within 30 s, one every group_interval (5 s)",
            lambda: abuse.switch_status(switch_port)["pings"] >= pings + 5,
            30,
            0.5,
        )
        cadence = (time.monotonic() - counted_from) / 5
        assert not switch_paged(events, first_ping), "the switch paged while all was well"

        # A rule that fails every evaluation (rules reloaded).
        stack.write_extra_rules({"groups": UNREACHABLE["groups"] + BROKEN_RULES["groups"]})
        t0 = time.time()
        reload_successfully(processes, stack, "prometheus")
        at = procs.wait_until(
            "BlockStackRuleEvaluationFailing",
            lambda: told(selfpages, "BlockStackRuleEvaluationFailing", t0),
            WAIT,
        )
        row(
            "a rule failing evaluation",
            "second notifier (BlockStackRuleEvaluationFailing)",
            "Prometheus -> Alertmanager -> receiver-self",
            t0,
            at,
        )
        stack.write_extra_rules(UNREACHABLE)
        reload_successfully(processes, stack, "prometheus")

        # A configuration reload that fails, of Prometheus, then of Alertmanager.
        for server, alertname in (
            ("prometheus", "BlockStackPrometheusBadConfig"),
            ("alertmanager", "BlockStackAlertmanagerBadConfig"),
        ):
            config = os.path.join(stack.workdir, f"{server}.yml")
            with open(config) as f:
                good = f.read()
            with open(config, "w") as f:
                f.write(good + "\nthis is: [not valid\n")
            t0 = time.time()
            processes.reload(server)
            at = procs.wait_until(alertname, lambda: told(selfpages, alertname, t0), WAIT)
            row(
                f"a bad {server}.yml reloaded",
                f"second notifier ({alertname})",
                "Prometheus -> Alertmanager -> receiver-self",
                t0,
                at,
            )
            with open(config, "w") as f:
                f.write(good)
            reload_successfully(processes, stack, server)

        # ebpf_exporter down: the collapse evidence is gone, which pages.
        t0 = time.time()
        processes.stop("ebpf")
        at = procs.wait_until(
            "BlockStackEvidenceExporterDown",
            lambda: told(pages, "BlockStackEvidenceExporterDown", t0, job="ebpf"),
            WAIT,
        )
        row(
            "ebpf_exporter down",
            "page receiver (BlockStackEvidenceExporterDown)",
            "Prometheus -> Alertmanager -> receiver",
            t0,
            at,
        )

        # The page receiver's disk full: the heartbeat cannot be written, so no ping.
        assert prometheus.query('process_start_time_seconds{job="receiver"}')
        filler = abuse.fill(mnt, 1 << 20)
        t0 = time.time()
        for alertname in (
            "BlockStackReceiverWriteFailing",
            "BlockStackPagerDiskFilling",
            "BlockStackHeartbeatStale",
        ):
            at = procs.wait_until(alertname, lambda: told(selfpages, alertname, t0), WAIT)
            row(
                "the page receiver's disk full",
                f"second notifier ({alertname})",
                "Prometheus -> Alertmanager -> receiver-self",
                t0,
                at,
            )
        at = procs.wait_until("the switch's page", lambda: switch_paged(events, t0), WAIT)
        row(
            "the page receiver's disk full",
            "dead man's switch (stand-in)",
            "no ping: the heartbeat's write failed (503)",
            t0,
            at,
        )
        assert not told(pages, "BlockStackReceiverWriteFailing", 0), "a page written on a full disk"
        os.unlink(filler)
        t1 = time.time()
        at = procs.wait_until(
            "the retried page", lambda: told(pages, "BlockStackReceiverWriteFailing", t1), WAIT
        )
        row(
            "(space freed)",
            "page receiver (the retried BlockStackReceiverWriteFailing)",
            "Alertmanager's retry",
            t1,
            at,
        )
        assert procs.wait_until(
            "the switch's resolve", lambda: switch_paged(events, t1, "up"), WAIT
        )

        # The page receiver down.
        t0 = time.time()
        processes.stop("receiver")
        at = procs.wait_until(
            "BlockStackPagerDown (receiver)",
            lambda: told(selfpages, "BlockStackPagerDown", t0, job="receiver"),
            WAIT,
        )
        row(
            "the page receiver down",
            "second notifier (BlockStackPagerDown)",
            "Prometheus -> Alertmanager -> receiver-self",
            t0,
            at,
        )
        at = procs.wait_until("the switch's page", lambda: switch_paged(events, t0), WAIT)
        row("the page receiver down", "dead man's switch (stand-in)", "no ping", t0, at)
        t1 = time.time()
        processes.start("receiver")
        assert procs.wait_until(
            "the switch's resolve", lambda: switch_paged(events, t1, "up"), WAIT
        )

        # Alertmanager down: nothing on the host can tell. What failed meanwhile, Prometheus's
        # sends, loses no page (it re-sends every firing alert at each resend delay once Alertmanager
        # is back); failing for longer than pager_send_errors_for (3m, not shortened here) it is a
        # ticket, BlockStackPrometheusErrorSendingAlerts, told once Alertmanager is back.
        t0 = time.time()
        processes.stop("alertmanager")
        at = procs.wait_until("the switch's page", lambda: switch_paged(events, t0), WAIT)
        row("Alertmanager down", "dead man's switch (stand-in)", "no ping", t0, at)
        t1 = time.time()
        processes.start("alertmanager")
        at = procs.wait_until("the switch's resolve", lambda: switch_paged(events, t1, "up"), WAIT)
        row(
            "(Alertmanager restarted)",
            "dead man's switch (stand-in): resolved",
            "the heartbeat again",
            t1,
            at,
        )

        # Prometheus down: the watchdog stops at its source.
        t0 = time.time()
        processes.stop("prometheus")
        at = procs.wait_until("the switch's page", lambda: switch_paged(events, t0), WAIT)
        row("Prometheus down", "dead man's switch (stand-in)", "no ping", t0, at)

        for path in (pages, selfpages):
            for _ in received(path):
                pass  # every line whole JSON
        print(f"\nheartbeat every {cadence:.1f} s; the whole matrix {time.time() - start:.0f} s\n")
        print("| fault | who was told | path | seconds |\n| --- | --- | --- | ---: |")
        print(
            "\n".join(
                f"| {fault} | {who} | {path} | {seconds:.0f} |"
                for fault, who, path, seconds in table
            )
        )
