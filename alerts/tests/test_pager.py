"""The pager watching itself, each failure caused for real (group blockstack-pager of
alerts/alerts.rules.yml): Prometheus, Alertmanager and the page receiver (blockstack_deploy.stack,
Debian's servers) on free 127.0.0.1 ports, the receiver's file on a 1 MiB tmpfs, and

    a webhook receiver on a closed port     -> BlockStackNotificationsFailing pages
    a rule that fails every evaluation      -> BlockStackRuleEvaluationFailing pages
    a second Alertmanager target that is down -> BlockStackPagerDown pages
    the always-firing watchdog              -> the receiver's /watchdog, about every minute
    the tmpfs filled                        -> the receiver answers 503, BlockStackPagerDiskFilling
                                               and BlockStackReceiverWriteFailing fire; space
                                               freed, Alertmanager's retry writes the page

The knobs' `for:` of the disk and down alerts are 5 s here (1m and 5m in production); the rules
are otherwise the shipped ones. Every process and the mount are removed on exit; ~2 minutes.
"""
import contextlib
import errno
import json
import os
import time

import pytest
import yaml
from page_receiver import received

from blockstack_deploy import procs
from blockstack_rules import knobs
from blockstack_deploy.stack import Stack
from blockstack_lab import loop
from blockstack_lab.api import Prometheus, request

pytestmark = [pytest.mark.root, pytest.mark.servers]

BROKEN_RULES = {"groups": [{"name": "broken", "rules": [
    # many-to-many: several `up` series per host on both sides; fails every evaluation
    {"record": "host:up:broken", "expr": "up * on (host) up"},
    # always firing, routed to a receiver nobody listens on
    {"alert": "PagerTestUnreachable", "expr": "vector(1)", "labels": {"severity": "warning", "route": "unreachable"}},
]}]}


class PagerStack(Stack):
    """The stack with the test's rules and an unreachable webhook and Alertmanager target."""

    def __init__(self, workdir, data_dir, closed_port):
        super().__init__(workdir, components=("receiver", "alertmanager", "prometheus"), data_dir=data_dir)
        self.closed = f"127.0.0.1:{closed_port}"

    def prometheus_config(self):
        config = super().prometheus_config()
        short = dict.fromkeys(("pager_down_for", "pager_disk_for"), "5s")  # from 1m and 5m: the test waits less
        rules = knobs.rule_files(knobs.load(), **short)[knobs.HOST_RULES[0]]
        paths = {"alerts.rules.yml": rules, "broken.rules.yml": yaml.safe_dump(BROKEN_RULES)}
        for name, text in paths.items():
            with open(os.path.join(self.data_dir, name), "w") as f:
                f.write(text)
        config["rule_files"] = [os.path.join(self.data_dir, name) for name in paths]
        for job in config["scrape_configs"]:
            if job["job_name"] == "alertmanager":
                job["static_configs"].append({"targets": [self.closed], "labels": {"host": self.host}})
        return config

    def alertmanager_config(self):
        config = super().alertmanager_config()
        config["route"]["routes"].insert(0, {"matchers": ['route="unreachable"'], "receiver": "unreachable",
                                             "group_wait": "0s", "group_interval": "5s"})
        config["receivers"].append({"name": "unreachable", "webhook_configs": [{"url": f"http://{self.closed}/page"}]})
        return config


def paged(stack, alertname, **labels):
    """The receiver time of the first page of alertname with these labels, or None."""
    return next((r["received_at"] for r, a in received(stack.pages_file) if r["path"] == "/page"
                 and a["labels"].get("alertname") == alertname and a["status"] == "firing"
                 and all(a["labels"].get(k) == v for k, v in labels.items())), None)


def receiver_metric(stack, name):
    status, text = request(stack.url("receiver", "/metrics"))
    assert status == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_the_pager_pages_on_its_own_failures(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("not root: this test mounts a tmpfs (sudo make test)", pytrace=False)
    with contextlib.ExitStack() as cleanup:
        mnt = cleanup.enter_context(loop.mounted("tmpfs", "size=1m", fstype="tmpfs", directory=tmp_path))
        data = tmp_path / "data"
        data.mkdir()
        stack = PagerStack(mnt, str(data), procs.free_port())
        missing = stack.missing()
        if missing:
            pytest.fail("missing prerequisites:\n  " + "\n  ".join(missing), pytrace=False)
        cleanup.enter_context(stack.running())
        start = time.time()
        prometheus = Prometheus(stack.url("prometheus"))
        figures = {}
        for what, alertname, labels in (
                ("a rule failing evaluation", "BlockStackRuleEvaluationFailing", {}),
                ("a scrape of a pager server failing", "BlockStackPagerDown", {"instance": stack.closed}),
                ("a webhook unreachable", "BlockStackNotificationsFailing", {"integration": "webhook"})):
            at = procs.wait_until(f"{alertname} paged", lambda: paged(stack, alertname, **labels), 150)
            figures[what] = f"{alertname} paged {at - start:.0f} s after the start"
        procs.wait_until("the watchdog at the receiver",
                         lambda: receiver_metric(stack, 'blockstack_receiver_requests_total{path="/watchdog",code="200"}'), 60)
        figures["the watchdog"] = f"at the receiver's /watchdog {time.time() - start:.0f} s after the start"

        # fill the receiver's filesystem: the next page cannot be written
        lines_before = len(open(stack.pages_file).read().splitlines())
        filler = os.path.join(mnt, "filler")
        with open(filler, "wb", buffering=0) as f:
            for _ in range(300):  # 1 MiB at most, 4 KiB at a time
                try:
                    f.write(b"\0" * 4096)
                except OSError as e:
                    assert e.errno == errno.ENOSPC
                    break
        filled = time.time()

        def firing(alertname):
            return prometheus.query(f'ALERTS{{alertname="{alertname}",alertstate="firing"}}')
        procs.wait_until("BlockStackReceiverWriteFailing firing", lambda: firing("BlockStackReceiverWriteFailing"), 150)
        assert firing("BlockStackPagerDiskFilling")
        figures["the receiver's disk full"] = (f"BlockStackPagerDiskFilling and BlockStackReceiverWriteFailing firing "
                                               f"{time.time() - filled:.0f} s after the fill")
        assert receiver_metric(stack, "blockstack_receiver_write_errors_total") >= 1
        assert len(open(stack.pages_file).read().splitlines()) == lines_before
        os.unlink(filler)
        freed = time.time()
        at = procs.wait_until("the retried page", lambda: paged(stack, "BlockStackReceiverWriteFailing"), 150)
        figures["space freed"] = f"BlockStackReceiverWriteFailing page written {at - freed:.0f} s later (Alertmanager's retry)"
        for line in open(stack.pages_file).read().splitlines():
            json.loads(line)  # every line whole
        print("\n" + "\n".join(f"{k}: {v}" for k, v in figures.items()))
