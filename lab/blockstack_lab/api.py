"""The HTTP APIs of Prometheus (and Thanos Query) and Alertmanager, for the tests, the benchmarks
and the lab: https://prometheus.io/docs/prometheus/latest/querying/api/ and Alertmanager's
/api/v2. Basic auth and a CA file for the exposed mode (`make up --auth`)."""

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request

from blockstack_testsupport import procs


def request(url, auth=None, ca=None, body=None, method=None, timeout=30):
    """(HTTP status, answer text) of one request: `auth` (user, password) as basic auth, `body` sent
    as JSON, https verified against `ca` (a CA file; None: the system's CAs). Raises URLError when
    nothing answers."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if auth:
        req.add_header(
            "Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode()
        )
    context = ssl.create_default_context(cafile=ca) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


class Client:
    """GET url + path?params, JSON decoded; `auth` (user, password) and `ca` (a CA file) for https."""

    def __init__(self, url, auth=None, ca=None, timeout=30):
        self.url, self.auth, self.ca, self.timeout = url.rstrip("/"), auth, ca, timeout

    def get(self, path, **params):
        url = self.url + path + ("?" + urllib.parse.urlencode(params, doseq=True) if params else "")
        status, text = request(url, self.auth, self.ca, timeout=self.timeout)
        if status >= 400:
            raise RuntimeError(f"{url}: HTTP {status}: {text}")
        return json.loads(text)


class Prometheus(Client):
    """Prometheus's /api/v1: every call returns the answer's `data` (raises unless `success`)."""

    def api(self, path, **params):
        body = self.get(path, **params)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, promql, **params):
        return self.api("/api/v1/query", query=promql, **params)["result"]

    def query_range(self, promql, start, end, step, **params):
        return self.api(
            "/api/v1/query_range", query=promql, start=start, end=end, step=step, **params
        )["result"]

    def value(self, promql, default=None):
        """The value of a one-series instant query as a float (`default` if it has none)."""
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else default

    def series(self, match, **params):
        return self.api("/api/v1/series", **{"match[]": match}, **params)

    def label_values(self, label, match=None, **params):
        return self.api(
            f"/api/v1/label/{label}/values", **({"match[]": match} if match else {}), **params
        )

    def targets(self):
        return self.api("/api/v1/targets")["activeTargets"]

    def rules(self, **params):
        return self.api("/api/v1/rules", **params)["groups"]

    def alerts(self):
        return self.api("/api/v1/alerts")["alerts"]

    def buildinfo(self):
        return self.api("/api/v1/status/buildinfo")

    def collapse_state(self, device):
        """What a collapse page of `device` rests on, as lines to print when a test's page did not
        come or came without its facts: the targets down, the rules in error, each rule group's
        evaluation time, the device's alerts, the evidence and its inputs now."""
        lines = [
            f"target {t['labels'].get('job')} {t['health']}: {t['lastError']}"
            for t in self.targets()
            if t["health"] != "up"
        ]
        for group in self.rules():
            lines.append(f"group {group['name']}: {group.get('evaluationTime')} s")
            lines += [
                f"  rule {rule['name']}: {rule.get('health')} {rule.get('lastError')}"
                for rule in group["rules"]
                if rule.get("health") != "ok"
            ]
        on = f'{{device="{device}"}}'
        for query in (
            f"ALERTS{on}",
            f"host_device_operation:blockstack_collapse_evidence:info{on}",
            f"host_device_operation:blockstack_collapse_refused:rate{on}",
            f"host_device_operation:blockstack_collapse_split:rate{on}",
            f"host_device_operation:ebpf_block_rq_missed_merges:rate{on}",
            f"host_device_operation:ebpf_block_rq_missed_merges:ratio{on}",
            f"host_device_operation:ebpf_block_rq_missed_merges:irate{on}",
            f"host_device_operation:ebpf_block_rq:rate{on}",
            f"host_devno:blockstack_device:info{on}",
            f"host_device:blockstack_queue_settings:info{on}",
            f"blockstack_queue_scheduler_info{on}",
        ):
            lines.append(f"{query}: {[(r['metric'], r['value'][1]) for r in self.query(query)]}")
        return "\n".join(lines)

    def wait_targets_up(self, count=None, timeout=60):
        """Until every scrape target (and `count` of them, if given) reports up; returns them."""

        def up():
            targets = self.targets()
            return (
                targets
                if targets
                and all(t["health"] == "up" for t in targets)
                and count in (None, len(targets))
                else None
            )

        try:
            return procs.wait_until("every scrape target up", up, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"targets not all up after {timeout} s: "
                f"{[(t['labels']['job'], t['health'], t['lastError']) for t in self.targets()]}"
            ) from None


class Alertmanager(Client):
    """Alertmanager's /api/v2."""

    def alerts(self, **params):
        return self.get("/api/v2/alerts", **params)

    def status(self):
        return self.get("/api/v2/status")
