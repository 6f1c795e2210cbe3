"""`make clean` (stackctl.py clean) keeps what cannot be regenerated: the TSDB, the pages, Grafana's
database and the secrets stay unless FORCE=1; the configuration and logs go."""

import os
import subprocess
import sys

from blockstack_deploy import roles

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def clean(state, *args):
    return subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "deploy", "stackctl.py"),
            "--state",
            str(state),
            "clean",
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def test_clean_keeps_data_pages_and_secrets_unless_forced(tmp_path):
    state = tmp_path / "state"
    for path in (
        "data/prometheus/wal/00000000",
        "pages/pages.jsonl",
        "grafana/data/grafana.db",
        "secrets/ca.crt",
        "config/prometheus.yml",
        "logs/prometheus.log",
        "ports.json",
    ):
        (state / path).parent.mkdir(parents=True, exist_ok=True)
        (state / path).write_text("x")
    out = clean(state)
    assert "FORCE=1" in out
    assert sorted(os.listdir(state)) == ["data", "grafana", "pages", "secrets"]
    assert (state / "pages" / "pages.jsonl").read_text() == "x"
    run = roles.self_pages_dir(str(state))  # the second notifier's (/run as root): it goes too
    os.makedirs(run, exist_ok=True)
    clean(state, "--force")
    assert not state.exists() and not os.path.exists(run)
