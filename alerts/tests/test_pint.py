"""The generated rules through cloudflare/pint (built by `make linters` into .build/bin/pint), offline,
every report counted (information included); exceptions in alerts/pint.hcl, each with a reason."""

import glob
import json
import os
import re
import subprocess

import pytest

pytestmark = pytest.mark.linters

ALERTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(ALERTS)
PINT = os.path.join(REPO, ".build", "bin", "pint")
CONFIG = os.path.join(ALERTS, "pint.hcl")


def pint(paths, tmp_path):
    """pint's reports on the rule files `paths`: [{"path", "reporter", "problem", "severity", ...}]."""
    if not os.access(PINT, os.X_OK):
        pytest.fail(f"{PINT} not built: run `make linters`", pytrace=False)
    report = tmp_path / "pint.json"
    done = subprocess.run(
        [
            PINT,
            "--offline",
            "--no-color",
            "--show-duplicates",
            "--config",
            CONFIG,
            "lint",
            "--min-severity=info",
            "--fail-on=info",
            "--json",
            str(report),
        ]
        + paths,
        capture_output=True,
        text=True,
        timeout=120,
    )
    problems = json.loads(report.read_text()) if report.exists() else []
    assert (done.returncode != 0) == bool(problems), (
        f"pint failed (exit {done.returncode}):\n{done.stderr}"
    )
    return problems


def test_the_rules_pass_pint(tmp_path):
    rules = sorted(glob.glob(os.path.join(ALERTS, "*.rules.yml")))
    assert len(rules) >= 3, rules
    problems = pint(rules, tmp_path)
    assert not problems, "pint:\n" + "\n".join(
        f"{os.path.relpath(p['path'], REPO)}:{p['lines'][0]} {p['severity']} {p['reporter']}: {p['problem']}"
        for p in problems
    )


def test_pint_reports_a_broken_rule(tmp_path):
    """The check can fail: rules pint must report (an alert with no condition, a bad range)."""
    bad = tmp_path / "bad.rules.yml"
    bad.write_text(
        "groups:\n  - name: bad\n    rules:\n      - alert: Always\n        expr: up\n"
        "      - record: x\n        expr: rate(node_load1[1x])\n"
    )
    problems = pint([str(bad)], tmp_path)
    assert {p["reporter"] for p in problems} >= {"alerts/comparison", "promql/syntax"}, problems


def test_every_exception_has_a_reason():
    with open(CONFIG) as f:
        text = f.read()
    blocks = re.findall(r"^rule \{.*?^\}", text, re.S | re.M)
    assert blocks, "no exception: drop the test or the file"
    for block in blocks:
        assert re.search(r"disable\s*=", block), block
        assert re.search(r"//\s*reason:\s*\S", block), (
            f"an exception without a `// reason:` line:\n{block}"
        )
