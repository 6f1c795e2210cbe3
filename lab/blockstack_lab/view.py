"""What the stack sees of the lab: Prometheus's alerts and lineup (requests per second and
sectors per request, per device and operation) through its API, the notifications in the page
receiver's file, and iostat's lineup from /proc/diskstats when no stack is attached."""

import dataclasses
import datetime
import json
import os
import socket
import time

import yaml

from page_receiver import received

from .api import Alertmanager, Prometheus

RULES = os.path.join(os.path.dirname(__file__), "..", "..", "alerts", "alerts.rules.yml")


def page_alerts(rules=RULES):
    """The alerts that page: severity critical (alerts/alertmanager.yml routes those to the page
    receiver)."""
    with open(rules) as f:
        groups = yaml.safe_load(f)["groups"]
    return frozenset(
        r["alert"]
        for g in groups
        for r in g["rules"]
        if "alert" in r and r.get("labels", {}).get("severity") == "critical"
    )


PAGE_ALERTS = page_alerts()


@dataclasses.dataclass
class Notified:
    received_at: float
    path: str  # /page or /ticket
    status: str  # firing or resolved
    alertname: str
    device: str
    starts_at: float
    labels: dict
    annotations: dict


class StackView:
    """Prometheus's and Alertmanager's APIs and the page receiver's file of one running stack."""

    def __init__(self, prometheus_url, pages_file, host=None, alertmanager_url=None):
        self.prometheus, self.pages_file = Prometheus(prometheus_url), pages_file
        self.alertmanager = Alertmanager(alertmanager_url) if alertmanager_url else None
        self.host = host or socket.gethostname()

    @classmethod
    def from_state(cls, state):
        """The stack `make up` runs in STATE (ports in STATE/ports.json)."""
        with open(os.path.join(state, "ports.json")) as f:
            ports = json.load(f)
        view = cls(
            f"http://127.0.0.1:{ports['prometheus']}",
            os.path.join(state, "pages", "pages.jsonl"),
            alertmanager_url=f"http://127.0.0.1:{ports['alertmanager']}",
        )
        # the basic auth of make up: Prometheus's (user admin) and Alertmanager's (user alertmanager)
        for client, user in ((view.prometheus, "admin"), (view.alertmanager, "alertmanager")):
            password = os.path.join(state, "secrets", f"{user}-password")
            if os.path.exists(password):
                with open(password) as f:
                    client.auth = (user, f.read().strip())
        return view

    @classmethod
    def from_stack(cls, stack):
        """A blockstack_deploy.stack.Stack started with .running()."""
        am = stack.url("alertmanager") if "alertmanager" in stack.components else None
        return cls(stack.url("prometheus"), stack.pages_file, stack.host, am)

    def notifications(self, since=0.0):
        """Every alert in every notification received at or after `since`, oldest first."""
        return [
            Notified(
                rec["received_at"],
                rec["path"],
                a["status"],
                a["labels"].get("alertname", ""),
                a["labels"].get("device", ""),
                datetime.datetime.fromisoformat(a["startsAt"]).timestamp()
                if a.get("startsAt")
                else 0.0,
                a["labels"],
                a.get("annotations", {}),
            )
            for rec, a in received(self.pages_file, since)
        ]

    def pages(self, device, status="firing"):
        """The paging alerts on this device the receiver got with this status."""
        return [
            n
            for n in self.notifications()
            if n.status == status and n.alertname in PAGE_ALERTS and n.device == device
        ]

    def alerts(self, devices, with_severity=False):
        """[(alertname, device, state[, severity])] pending or firing in Prometheus on these devices."""
        regex = "|".join(devices)
        res = self.prometheus.query(f'ALERTS{{alertstate=~"pending|firing",device=~"{regex}"}}')
        keys = ("alertname", "device", "alertstate") + (("severity",) if with_severity else ())
        return sorted({tuple(r["metric"].get(k, "") for k in keys) for r in res})

    def suppressed(self):
        """{(alertname, device)} Alertmanager holds back (inhibited or silenced)."""
        if not self.alertmanager:
            return set()
        alerts = self.alertmanager.alerts()
        return {
            (a["labels"].get("alertname", ""), a["labels"].get("device", ""))
            for a in alerts
            if a.get("status", {}).get("state") == "suppressed"
        }

    def lineup(self, devices):
        """{device: {operation: (requests/s, sectors per request)}} from the recording rules."""
        regex = "|".join(devices)
        out = {}
        rates = self.prometheus.query(
            f'host_device_operation:node_disk_completed:rate{{device=~"{regex}"}}'
        )
        sizes = self.prometheus.query(
            f'host_device_operation:node_disk_request_size_sectors:avg{{device=~"{regex}"}}'
        )
        size = {
            (r["metric"]["device"], r["metric"]["operation"]): float(r["value"][1]) for r in sizes
        }
        for r in rates:
            dev, op, rate = r["metric"]["device"], r["metric"]["operation"], float(r["value"][1])
            if rate >= 0.5:
                out.setdefault(dev, {})[op] = (rate, size.get((dev, op), float("nan")))
        return out

    def jbd2_wait(self, device):
        return self.prometheus.value(
            f'host_device:ebpf_jbd2_credit_wait_seconds:avg{{device="{device}"}}'
        )


class Diskstats:
    """iostat's view from /proc/diskstats when no stack is attached: r/s, w/s and sectors per
    request between two calls."""

    def __init__(self):
        self.last = (time.monotonic(), self._read())

    @staticmethod
    def _read():
        stats = {}
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                # fields: reads completed (3), sectors read (5), writes completed (7), sectors written (9)
                stats[p[2]] = (int(p[3]), int(p[5]), int(p[7]), int(p[9]))
        return stats

    def lineup(self, devices):
        now, stats = time.monotonic(), self._read()
        t0, old = self.last
        self.last = (now, stats)
        dt = max(now - t0, 1e-3)
        out = {}
        for dev in devices:
            if dev not in stats or dev not in old:
                continue
            r, rs, w, ws = (a - b for a, b in zip(stats[dev], old[dev]))
            for op, n, sectors in (("read", r, rs), ("write", w, ws)):
                if n / dt >= 0.5:
                    out.setdefault(dev, {})[op] = (n / dt, sectors / n)
        return out
