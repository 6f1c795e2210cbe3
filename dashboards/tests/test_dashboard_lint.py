"""The committed dashboard through grafana/dashboard-linter (built by `make linters` into
.build/bin/dashboard-linter), warnings included (--strict); exceptions in dashboards/.lint, each
with a reason."""

import json
import os
import shutil
import subprocess

import pytest
import yaml

import blockstack_dashboard

pytestmark = pytest.mark.linters

DASHBOARDS = os.path.dirname(blockstack_dashboard.OUTPUT)
LINTER = os.path.join(os.path.dirname(DASHBOARDS), ".build", "bin", "dashboard-linter")
CONFIG = os.path.join(DASHBOARDS, ".lint")


def lint(path):
    """(exit status, the linter's report lines: one per failed check)."""
    if not os.access(LINTER, os.X_OK):
        pytest.fail(f"{LINTER} not built: run `make linters`", pytrace=False)
    done = subprocess.run(
        [LINTER, "lint", "--strict", "--config", CONFIG, path],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = done.stdout + done.stderr
    return done.returncode, [line for line in report.splitlines() if "❌" in line or "⚠" in line]


def test_the_dashboard_passes_dashboard_linter():
    status, problems = lint(blockstack_dashboard.OUTPUT)
    assert status == 0 and not problems, "dashboard-linter:\n" + "\n".join(problems)


def test_dashboard_linter_reports_a_broken_panel(tmp_path):
    """The check can fail: a panel without a description, on a fixed datasource."""
    with open(blockstack_dashboard.OUTPUT) as f:
        dashboard = json.load(f)
    panel = next(p for p in dashboard["panels"] if p["type"] == "timeseries")
    panel["description"] = ""
    panel["datasource"] = {"type": "prometheus", "uid": "some-prometheus"}
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(dashboard))
    shutil.copy(CONFIG, tmp_path / ".lint")
    status, problems = lint(str(path))
    assert status != 0
    text = "\n".join(problems)
    for expected in ("description", "templated datasource"):
        assert expected in text, f"no report about the {expected}: {text}"


def test_every_exception_has_a_reason():
    with open(CONFIG) as f:
        config = yaml.safe_load(f)
    assert set(config) == {"exclusions"}, (
        "warnings downgrade a rule: make it an exclusion with a reason"
    )
    for rule, exclusion in config["exclusions"].items():
        assert (exclusion or {}).get("reason", "").strip(), f"{rule}: an exception without a reason"
        for entry in exclusion.get("entries", []):
            assert set(entry) <= {"panel", "dashboard", "targetidx", "reason"}, (rule, entry)
