"""The monitoring mixin (mixin/, written by blockstack_rules.mixin): current, equal to the repo's rules,
its `_config` moving the rules as config.yml's knobs move alerts/*.rules.yml, and what `mixtool lint`
checks. The unit tier reads the committed files; the linters tier (`make linters` builds go-jsonnet
into .build/bin) formats, lints and evaluates the jsonnet, and runs pint, dashboard-linter and the
rules' promtool unit tests on the mixin's output."""

import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from test_knobs import moved  # a knob's value changed so that everything derived from it changes

import blockstack_dashboard
from blockstack_deploy import stack
from blockstack_rules import knobs, mixin

ROOT = knobs.REPO
MIXIN = ROOT / "mixin"
BIN = ROOT / ".build" / "bin"
OUT = {"recording.rules.yml": "prometheusRules", "alerts.rules.yml": "prometheusAlerts"}
JSONNET_SOURCES = sorted([*MIXIN.glob("*.libsonnet"), *MIXIN.glob("*.jsonnet")])


def load(path):
    return yaml.safe_load(path.read_text())


def repo_rules(name):
    return load(ROOT / "alerts" / name)


def mixin_rules():
    for name in OUT:
        for group in load(MIXIN / "out" / name)["groups"]:
            for rule in group["rules"]:
                yield group["name"], rule


def run(argv, timeout=600):
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, argv))}\n{r.stdout}\n{r.stderr}"
    return r.stdout


# --- unit tier: the committed files ------------------------------------------------------------------


def test_generated_mixin_is_current():
    run([sys.executable, MIXIN / "generate.py", "--check"])


def test_check_mode_fails_on_a_stale_file(tmp_path, monkeypatch, capsys):
    shutil.copytree(MIXIN, tmp_path / "mixin")
    stale = tmp_path / "mixin" / "config.libsonnet"
    stale.write_text(stale.read_text() + "// edited by hand\n")
    monkeypatch.setattr(mixin, "MIXIN", tmp_path / "mixin")
    assert mixin.main(blockstack_dashboard.build, ["--check"]) == 1
    assert "make generate" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(OUT))
def test_out_files_are_the_repos_rules(name):
    """mixin/out/NAME parses to exactly alerts/NAME (groups, order, every field)."""
    assert load(MIXIN / "out" / name) == repo_rules(name)


def test_the_fleet_rules_stay_out():
    """fleet.rules.yml is the central watcher's (docs/fleet.md), not a host Prometheus's."""
    fleet = {g["name"] for g in repo_rules("fleet.rules.yml")["groups"]}
    assert fleet and not fleet & {group for group, _ in mixin_rules()}
    assert sorted(p.name for p in (MIXIN / "out").iterdir()) == sorted(OUT)


def test_prometheus_rule_manifest():
    rule = load(MIXIN / "prometheus-rule.yaml")
    assert list(rule) == ["apiVersion", "kind", "metadata", "spec"]
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["name"] == "blockstack-merges"
    assert re.fullmatch(
        r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", rule["metadata"]["name"]
    )  # a DNS-1123 name
    # kube-prometheus's Prometheus selects PrometheusRules labelled so (its ruleSelector)
    assert {"prometheus": "k8s", "role": "alert-rules"}.items() <= rule["metadata"][
        "labels"
    ].items()
    assert list(rule["spec"]) == ["groups"]
    assert rule["spec"]["groups"] == sum((repo_rules(name)["groups"] for name in OUT), [])


def test_rules_read_the_knobs_from_config():
    """The selectors appear in the rules only through _config: no selector's value is written out."""
    k = knobs.load()
    text = "".join(
        (MIXIN / f).read_text()
        for f in ("rules.libsonnet", "alerts.libsonnet", "dashboards.libsonnet")
    )
    for name in ("node_selector", "blockstack_selector", "ebpf_selector"):
        assert k[name] not in text, f"{name}'s value {k[name]} written into the mixin"
        assert f"%({name})s" in text or f"$._config.{name}" in text, f"{name} never read"
    for_values = re.findall(r"'for': (.+),", text)
    assert for_values and all(v.startswith("$._config.") for v in for_values), for_values


def test_config_holds_the_knobs_the_rules_read():
    """config.libsonnet declares every knob the host rule templates read (and the dashboard's string
    knobs, today all among them), with config.yml's values and nothing else."""
    k = knobs.load()
    read = set()
    for template, _, _ in mixin.PARTS:
        read |= set(
            re.findall(r"\$\{([a-z0-9_]+)\}", knobs.template_text(knobs.TEMPLATES / template))
        )
    text = (MIXIN / "config.libsonnet").read_text()
    declared = dict(re.findall(r"^    ([a-z][a-z0-9_]*): (.+),(?:  //.*)?$", text, re.M))
    assert read <= set(declared) <= set(k), read ^ set(declared)
    for name, literal in declared.items():
        value = yaml.safe_load(literal)  # a jsonnet string or number literal is YAML too
        assert value == k[name] and type(value) is type(k[name]), (name, literal)


# mixtool lint's checks (monitoring-mixins/mixtool lint: alerts have severity, summary and description,
# names are CamelCase; recording rules are named level:metric:operations), and unique names.
def test_alerts_are_what_mixtool_lint_wants():
    names = []
    for _group, rule in mixin_rules():
        if "alert" not in rule:
            continue
        names.append(rule["alert"])
        assert re.fullmatch(r"[A-Z][a-z0-9]+(?:[A-Z0-9][a-z0-9]*)*", rule["alert"]), (
            f"{rule['alert']}: not CamelCase"
        )
        assert rule.get("labels", {}).get("severity") in ("critical", "warning", "info"), rule[
            "alert"
        ]
        for key in ("summary", "description"):
            assert rule.get("annotations", {}).get(key, "").strip(), (
                f"{rule['alert']}: no {key} annotation"
            )
    assert names and len(names) == len(set(names))


def test_recording_rules_are_named_level_metric_operations():
    records = [rule["record"] for _, rule in mixin_rules() if "record" in rule]
    assert records
    for name in records:
        assert re.fullmatch(r"[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*", name), name


def test_every_rule_keeps_its_comment():
    """The comment above each rule of alerts/src/ stands above it in the jsonnet too."""
    for name in ("rules.libsonnet", "alerts.libsonnet"):
        lines = (MIXIN / name).read_text().splitlines()
        rules = [i for i, line in enumerate(lines) if re.match(r"\s*(record|alert): '", line)]
        assert rules, name
        for i in rules:
            assert lines[i - 1].strip() == "{" and lines[i - 2].strip().startswith("//"), (
                f"{name}: {lines[i]}"
            )


def test_group_names_are_unique():
    groups = [g["name"] for name in OUT for g in load(MIXIN / "out" / name)["groups"]]
    assert len(groups) == len(set(groups))


def test_promtool_check_rules():
    """Debian's promtool (the stack's default servers) on the mixin's plain rules files."""
    promtool = stack.program("promtool", "debian")
    out = run([promtool, "check", "rules", *sorted((MIXIN / "out").glob("*.yml"))])
    assert out.count("SUCCESS") == len(OUT)


# --- linters tier: go-jsonnet, pint, dashboard-linter, the rules' unit tests -------------------------


def tool(name):
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} not built: run `make linters`", pytrace=False)
    return path


def evaluate(code):
    """A jsonnet expression evaluated with mixin/ on the library path, as JSON."""
    return json.loads(run([tool("jsonnet"), "-J", MIXIN, "-e", code], timeout=120))


@pytest.mark.linters
def test_jsonnetfmt_clean():
    assert JSONNET_SOURCES
    r = subprocess.run(
        [tool("jsonnetfmt"), "--test", *JSONNET_SOURCES],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, (
        f"not as jsonnetfmt writes them (jsonnetfmt -i FILE; or the generator):\n{r.stderr}"
    )


@pytest.mark.linters
def test_jsonnetfmt_reports_a_badly_formatted_file(tmp_path):
    """The check can fail."""
    bad = tmp_path / "bad.libsonnet"
    bad.write_text('{ a:   "x" }\n')
    assert (
        subprocess.run(
            [tool("jsonnetfmt"), "--test", bad], capture_output=True, timeout=60
        ).returncode
        != 0
    )


@pytest.mark.linters
@pytest.mark.parametrize("path", JSONNET_SOURCES, ids=lambda p: p.name)
def test_jsonnet_lint_clean(path):
    out = run([tool("jsonnet-lint"), "-J", MIXIN, path], timeout=120)
    assert not out.strip(), out


@pytest.mark.linters
def test_the_mixin_evaluates_to_the_repos_rules_and_dashboard():
    m = evaluate("import 'mixin.libsonnet'")  # hidden fields (::) stay out of a plain evaluation
    assert m == {}
    for name, field in OUT.items():
        assert evaluate(f"(import 'mixin.libsonnet').{field}") == repo_rules(name), name
    dashboards = evaluate("(import 'mixin.libsonnet').grafanaDashboards")
    assert dashboards == {"block-stack-merges.json": json.loads(mixin.DASHBOARD.read_text())}


@pytest.mark.linters
def test_config_evaluates_to_the_knobs():
    config = evaluate("(import 'mixin.libsonnet')._config")
    k = knobs.load()
    assert config == {name: k[name] for name in config}


@pytest.mark.linters
def test_render_writes_the_committed_outputs(tmp_path):
    """render.jsonnet (`make mixin`): the rules files, the PrometheusRule and the dashboard, as committed."""
    run([tool("jsonnet"), "-S", "-m", tmp_path, MIXIN / "render.jsonnet"], timeout=120)
    for name in OUT:
        assert load(tmp_path / name) == load(MIXIN / "out" / name), name
    assert load(tmp_path / "prometheus-rule.yaml") == load(MIXIN / "prometheus-rule.yaml")
    assert json.loads((tmp_path / "block-stack-merges.json").read_text()) == json.loads(
        mixin.DASHBOARD.read_text()
    )


@pytest.mark.linters
def test_config_overrides_move_the_rules_as_the_knobs_do():
    """Every knob overridden through `_config+::` gives the rules that config.yml with the same
    values renders: the mixin reads every threshold, window and selector from _config (and the
    dashboard its selectors, windows and links)."""
    k = knobs.load()
    config = evaluate("(import 'mixin.libsonnet')._config")
    overrides = {name: moved(k[name]) for name in config}
    fields = [*OUT.values(), "grafanaDashboards"]
    m = evaluate(
        f"local m = (import 'mixin.libsonnet') + {{ _config+:: {json.dumps(overrides)} }}; "
        f"{{ [f]: m[f] for f in {json.dumps(fields)} }}"
    )
    for template, field, _ in mixin.PARTS:
        expected = yaml.safe_load(
            knobs.render(knobs.template_text(knobs.TEMPLATES / template), {**k, **overrides})
        )
        assert m[field] == expected, field
        assert m[field] != repo_rules(template[: -len(".in")]), (
            f"{field}: no override moved anything"
        )
    # The dashboard: its selectors, windows and links move; its numbers are config.yml's.
    strings = {name: value for name, value in overrides.items() if isinstance(value, str)}
    dashboard = m["grafanaDashboards"]["block-stack-merges.json"]
    assert dashboard == blockstack_dashboard.build(knobs.Knobs({**k, **strings}))
    assert dashboard != json.loads(mixin.DASHBOARD.read_text())


@pytest.mark.linters
def test_render_takes_a_mixin_with_overrides(tmp_path):
    """mixin/README.md's recipes: render.jsonnet with --tla-code, the pager group dropped."""
    knob = "node_selector"
    code = (
        f'mixin=(import "mixin.libsonnet") + {{ _config+:: {{ {knob}: "job=\\"node-exporter\\"" }}, '
        'prometheusAlerts+:: { groups: std.filter(function(g) g.name != "blockstack-pager", super.groups) } }'
    )
    run(
        [
            tool("jsonnet"),
            "-J",
            MIXIN,
            "-S",
            "-m",
            tmp_path,
            "--tla-code",
            code,
            MIXIN / "render.jsonnet",
        ],
        timeout=120,
    )
    alerts, recording = load(tmp_path / "alerts.rules.yml"), load(tmp_path / "recording.rules.yml")
    assert [g["name"] for g in alerts["groups"]] == [
        g["name"]
        for g in repo_rules("alerts.rules.yml")["groups"]
        if g["name"] != "blockstack-pager"
    ]
    exprs = " ".join(rule["expr"] for g in recording["groups"] for rule in g["rules"])
    assert 'job="node-exporter"' in exprs and 'job="node"' not in exprs


@pytest.mark.linters
def test_prometheus_rule_jsonnet_is_the_committed_manifest():
    rule = evaluate("(import 'prometheus-rule.jsonnet')(import 'mixin.libsonnet')")
    assert rule == load(MIXIN / "prometheus-rule.yaml")


@pytest.mark.linters
def test_the_mixin_rules_pass_pint(tmp_path):
    """cloudflare/pint with alerts/pint.hcl, as alerts/tests/test_pint.py runs it on alerts/*.rules.yml."""
    report = tmp_path / "pint.json"
    done = subprocess.run(
        [
            tool("pint"),
            "--offline",
            "--no-color",
            "--show-duplicates",
            "--config",
            ROOT / "alerts" / "pint.hcl",
            "lint",
            "--min-severity=info",
            "--fail-on=info",
            "--json",
            report,
            *sorted((MIXIN / "out").glob("*.yml")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    problems = json.loads(report.read_text()) if report.exists() else []
    assert done.returncode == 0 and not problems, (
        f"pint (exit {done.returncode}): {done.stderr}\n"
        + "\n".join(
            f"{p['path']}:{p['lines'][0]} {p['severity']} {p['reporter']}: {p['problem']}"
            for p in problems
        )
    )


@pytest.mark.linters
def test_the_mixin_dashboard_passes_dashboard_linter(tmp_path):
    """The dashboard as the mixin evaluates it, with the exceptions of dashboards/.lint."""
    path = tmp_path / "block-stack-merges.json"
    dashboards = evaluate("(import 'mixin.libsonnet').grafanaDashboards")
    path.write_text(json.dumps(dashboards["block-stack-merges.json"], indent=2))
    done = subprocess.run(
        [
            tool("dashboard-linter"),
            "lint",
            "--strict",
            "--config",
            ROOT / "dashboards" / ".lint",
            path,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    problems = [
        line for line in (done.stdout + done.stderr).splitlines() if "❌" in line or "⚠" in line
    ]
    assert done.returncode == 0 and not problems, "dashboard-linter:\n" + "\n".join(problems)


# The repo's promtool unit tests (alerts/tests/*.test.yml) on the mixin's files: each test file's
# rule_files pointed at mixin/out/. In the linters tier, not the unit tier: alerts.test.yml takes
# about a minute of a core, and test_out_files_are_the_repos_rules already proves the files equal.
@pytest.mark.linters
@pytest.mark.parametrize("name", list(OUT))
def test_promtool_unit_tests_on_the_mixin_output(name, tmp_path):
    source = ROOT / "alerts" / "tests" / name.replace(".rules.yml", ".test.yml")
    text, count = re.subn(
        r"^(\s*- )\.\./([a-z]+\.rules\.yml)$",
        lambda m: m.group(1) + str(MIXIN / "out" / m.group(2)),
        source.read_text(),
        flags=re.M,
    )
    rule_files = load(source)["rule_files"]
    assert count == len(rule_files) and all((MIXIN / "out" / f[3:]).exists() for f in rule_files), (
        rule_files
    )
    copy = tmp_path / source.name
    copy.write_text(text)
    out = run([stack.program("promtool", "debian"), "test", "rules", copy])
    assert "SUCCESS" in out
