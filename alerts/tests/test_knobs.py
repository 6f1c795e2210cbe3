"""One source for every knob: alerts/config.yml, read through blockstack_rules.knobs by the rule
templates and the dashboard generator. Every knob is read, none is declared anywhere else, and no
threshold, window or selector of a rule template or of the dashboard is written as a literal."""

import os
import re

import pytest
import yaml

import blockstack_dashboard
from blockstack_exporter import checks, doctor
from blockstack_rules import knobs

SKIP_DIRS = {".git", ".venv", ".build", ".state", "node_modules", "__pycache__", "fixtures"}
# Numbers a rule may write out: 0 and 1 (comparisons, `* 0 + 1`, a full COW at ratio 1) and the
# units (512-byte sectors, 1024 bytes per KiB).
UNIT_CONSTANTS = {0, 1, 512, 1024}


def test_every_knob_is_read_by_a_rule_or_the_dashboard():
    k = knobs.load()
    knobs.rule_files(k)
    blockstack_dashboard.build(k)
    k.used |= {
        *checks.KNOBS,
        *doctor.INTERVAL_KNOBS,
    }  # the exporter's table of checks and blockstack-doctor
    assert set(k) - k.used == set(), (
        "knobs no rule template, not the dashboard and not the checks read"
    )


def test_an_unknown_knob_is_an_error():
    with pytest.raises(ValueError, match=r"unknown knob \$\{collapse_max_sector\}"):
        knobs.render("expr: x <= ${collapse_max_sector}", knobs.load())


def test_only_braced_knobs_are_replaced():
    """PromQL's $1, Go templates' $labels and Grafana's $__rate_interval pass through."""
    text = '{{ $labels.device }} "$1" [$__rate_interval] $value [${rate_window}]'
    assert (
        knobs.render(text, knobs.load())
        == '{{ $labels.device }} "$1" [$__rate_interval] $value [20s]'
    )


def test_no_knob_is_declared_outside_config_yml():
    """A knob's name given a value anywhere else: a YAML/JSON key, or in Python `name = 16`,
    `"name": "30m"`, `NAME=16` (a literal, not a value read from the knobs)."""
    names = "|".join(knobs.load())
    declared = {
        ".py": re.compile(rf"""\b({names})\b["']?\s*[:=]\s*[-\d"'.]""", re.I),
        ".yml": re.compile(rf"""^\s*-?\s*["']?({names})["']?\s*:""", re.M),
    }
    declared[".yaml"] = declared[".json"] = declared[".yml"]
    found = []
    for top, dirs, files in os.walk(knobs.REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        for name in files:
            path = os.path.join(top, name)
            pattern = declared.get(os.path.splitext(name)[1])
            # the exporter ships config.yml as a link to it: the same file, not a second declaration
            if pattern and os.path.realpath(path) != str(knobs.CONFIG):
                with open(path) as f:
                    found += [
                        f"{os.path.relpath(path, knobs.REPO)}: {m.group(1)}"
                        for m in pattern.finditer(f.read())
                    ]
    assert not found, (
        "knobs declared outside alerts/config.yml (read them with blockstack_rules.knobs):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    "template", sorted(knobs.TEMPLATES.glob("*.rules.yml.in")), ids=lambda p: p.name
)
def test_rule_templates_write_no_threshold(template):
    """Every `for:`, range and number a rule evaluates is a knob, bar 0, 1 and units."""
    doc = yaml.safe_load(re.sub(r"\$\{[a-z0-9_]+\}", "KNOB", template.read_text()))
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            for key in ("for", "keep_firing_for"):
                assert rule.get(key, "KNOB") == "KNOB", f"{name}: {key}: {rule[key]} is not a knob"
            expr = re.sub(r'"[^"]*"', '""', rule["expr"])  # label values, label_replace arguments
            for window in re.findall(r"\[([^\]]*)\]", expr):
                assert window == "KNOB", f"{name}: range [{window}] is not a knob"
            for number in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", expr):
                assert float(number) in UNIT_CONSTANTS, f"{name}: {number} is not a knob"


def moved(value):
    """A knob's value changed so that nothing derived from it keeps its old value."""
    if isinstance(value, (int, float)):
        return value * 3 if isinstance(value, int) else value / 2
    if re.fullmatch(r"\d+[smhd]", value):
        return f"{int(value[:-1]) * 3}{value[-1]}"
    if '"' in value:
        return re.sub(r'"([^"]*)"', r'"\1-moved"', value)
    return value + "-moved"


def facts(dashboard):
    """Threshold steps by place, and the job selectors and range windows of every query."""
    steps, tokens = {}, set()
    stack = [("", dashboard)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("steps"), list):
                steps[path] = [s["value"] for s in node["steps"] if s["value"] is not None]
            if isinstance(node.get("expr"), str):
                grafanas = r"\[\$__(rate_interval|interval|range):?\]"  # Grafana's windows
                expr = re.sub(grafanas, "", node["expr"])
                tokens |= set(re.findall(r'job=~?"[^"]*"|\[[^\]]+\]', expr))
            stack.extend((f"{path}/{key}", v) for key, v in node.items())
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(node))
    return steps, tokens


def test_dashboard_thresholds_and_selectors_are_knobs():
    """Build the dashboard with every knob moved: every threshold, selector and window it draws
    must move too. One that stays is written in the generator instead of read from the knobs."""
    k = knobs.load()
    steps, tokens = facts(blockstack_dashboard.build(k))
    moved_steps, moved_tokens = facts(
        blockstack_dashboard.build(knobs.Knobs({n: moved(v) for n, v in k.items()}))
    )
    assert steps and tokens
    stuck = [
        f"{path}: {a}"
        for path, values in steps.items()
        for a, b in zip(values, moved_steps[path])
        if a == b
    ]
    assert not stuck, "dashboard thresholds that are not knobs:\n" + "\n".join(stuck)
    assert not tokens & moved_tokens, (
        f"selectors or windows that are not knobs: {sorted(tokens & moved_tokens)}"
    )
