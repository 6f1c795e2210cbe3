"""What Grafana does with the dashboard's queries, without Grafana: resolve the template
variables against Prometheus, interpolate them into each query, pick step and rate interval,
and run the query over a time range. Used by the query test and the preview.

It follows Grafana 10's Prometheus datasource:
- variable syntax $var, ${var}, ${var:format} and [[var]]; an unknown name is left as it is
  (so label_replace's "$1" survives);
- a multi-value or include-all variable is regex-escaped and joined as (a|b); a single-value
  variable is only escaped for backslashes and quotes (prometheusRegularEscape);
- label_values(selector, label) -> /api/v1/label/LABEL/values?match[]=selector over the range;
  query_result(expr) -> an instant query at the end of the range, each series written as
  `name{l="v", ...} value timestamp_ms`, then the variable's regex (first group, or the named
  groups text/value);
- $__interval = range / max data points, rounded, at least the datasource's scrape interval
  (timeInterval); step = $__interval; $__rate_interval = max($__interval + scrape, 4 * scrape);
  $__range = the range in whole seconds.
"""
import json
import math
import re
import urllib.parse

from blockstack_deploy import procs

VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")
REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|{}\[\]'])")
DEFAULT_MAX_DATA_POINTS = 1000  # about a full-width panel's pixels


def regular_escape(value):
    return value.replace("\\", "\\\\").replace("'", "\\\\'")


def special_regex_escape(value):
    return REGEX_SPECIAL.sub(r"\\\\\1", value)


def format_value(var, value):
    """A variable's value as the Prometheus datasource writes it into a query."""
    if not var.get("multi") and not var.get("includeAll"):
        return regular_escape(value if isinstance(value, str) else value[0])
    values = [value] if isinstance(value, str) else list(value)
    escaped = [special_regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def round_interval(seconds):
    """Grafana's rangeutil.roundInterval, for the sizes a dashboard meets."""
    table = [(0.015, 0.01), (0.035, 0.02), (0.075, 0.05), (0.15, 0.1), (0.35, 0.2), (0.75, 0.5), (1.5, 1),
             (3.5, 2), (7.5, 5), (12.5, 10), (17.5, 15), (25, 20), (45, 30), (90, 60), (450, 300),
             (900, 600), (1500, 1200), (2700, 1800), (5400, 3600), (9000, 7200), (16200, 10800),
             (32400, 21600), (86400, 43200)]
    for limit, value in table:
        if seconds < limit:
            return value
    return 86400


def duration(seconds):
    seconds = max(1, int(round(seconds)))
    return f"{seconds}s"


class Grafana:
    """Queries a Prometheus at `url` the way Grafana would for `dashboard` over [start, end]."""

    def __init__(self, url, dashboard, start, end, scrape_interval):
        self.url, self.dashboard = url.rstrip("/"), dashboard
        self.start, self.end, self.scrape = float(start), float(end), float(scrape_interval)
        self.variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        self.values = {}

    # -- HTTP ----------------------------------------------------------------------------------
    def api(self, path, **params):
        query = urllib.parse.urlencode(params, doseq=True)
        body = json.loads(procs.http_get(f"{self.url}{path}?{query}", timeout=60))
        if body.get("status") != "success":
            raise RuntimeError(f"{path}: {body}")
        return body["data"]

    # -- time ----------------------------------------------------------------------------------
    def interval(self, max_data_points=None):
        points = max_data_points or DEFAULT_MAX_DATA_POINTS
        return max(self.scrape, round_interval((self.end - self.start) / points))

    def builtins(self, max_data_points=None):
        interval = self.interval(max_data_points)
        rate = max(interval + self.scrape, 4 * self.scrape)
        rng = self.end - self.start
        return {"__interval": duration(interval), "__interval_ms": str(int(interval * 1000)),
                "__rate_interval": duration(rate), "__range": duration(rng), "__range_s": str(int(rng)),
                "__range_ms": str(int(rng * 1000))}

    # -- variables -----------------------------------------------------------------------------
    def interpolate(self, text, overrides=None, max_data_points=None):
        values = dict(self.values)
        values.update(overrides or {})
        builtins = self.builtins(max_data_points)

        def repl(m):
            name = m.group(1) or m.group(2) or m.group(4)
            if name in builtins:
                return builtins[name]
            if name not in values:
                return m.group(0)
            var = self.variables[name]
            if var["type"] == "datasource":
                return values[name]
            return format_value(var, values[name])

        return VARIABLE.sub(repl, text)

    def variable_options(self, name):
        """The options a query variable offers, given the values chosen for the variables before it."""
        var = self.variables[name]
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        query = self.interpolate(query)
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", query, re.S)
        if m:
            options = self.api(f"/api/v1/label/{m.group(2)}/values", **{"match[]": m.group(1)},
                               start=self.start, end=self.end)
        else:
            m = re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.S)
            if not m:
                raise ValueError(f"variable {name}: unsupported query {query!r}")
            result = self.api("/api/v1/query", query=m.group(1), time=self.end)["result"]
            options = [self.series_text(s) for s in result]
        regex = var.get("regex")
        if regex:
            pattern = re.compile(regex.strip("/").replace("(?<", "(?P<"))
            picked = []
            for o in options:
                found = pattern.search(o)
                if found:
                    groups = found.groupdict()
                    picked.append(groups.get("value") or (found.group(1) if found.groups() else found.group(0)))
            options = picked
        return sorted(set(options))

    @staticmethod
    def series_text(series):
        labels = dict(series["metric"])
        name = labels.pop("__name__", "")
        inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
        value, ts = series["value"][1], series["value"][0]
        return f"{name}{{{inner}}} {value} {int(float(ts) * 1000)}"

    def choose(self, name, value):
        """Select `value` (a string, a list, or "$__all" for every option) for a variable."""
        var = self.variables[name]
        if var["type"] == "datasource":
            self.values[name] = value
            return value
        options = self.variable_options(name)
        if value == "$__all":
            if not var.get("includeAll"):
                raise ValueError(f"variable {name} has no All option")
            chosen = options
        else:
            wanted = [value] if isinstance(value, str) else value
            missing = [w for w in wanted if w not in options]
            if missing:
                raise ValueError(f"variable {name}: {missing} not among the options {options}")
            chosen = value
        self.values[name] = chosen
        return options

    # -- panels --------------------------------------------------------------------------------
    def query_range(self, expr, max_data_points=None, overrides=None):
        """Interpolate and run expr over the range; (interpolated expr, step, result)."""
        text = self.interpolate(expr, overrides, max_data_points)
        step = self.interval(max_data_points)
        start = math.floor(self.start / step) * step
        end = math.ceil(self.end / step) * step
        data = self.api("/api/v1/query_range", query=text, start=start, end=end, step=step)
        return text, step, data["result"]
