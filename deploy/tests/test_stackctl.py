"""stackctl.py's command line as the Makefile, the docs and the lab write it: --state and
--servers before or after the command, each command's own options, errors as exit status 2."""

import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def stackctl(*args):
    return subprocess.run(
        [sys.executable, os.path.join(REPO, "deploy", "stackctl.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ("--state", "{s}", "status"),  # make status
        ("status", "--state", "{s}"),
        ("--state", "{s}", "logs"),  # make logs
        ("--state", "{s}", "logs", "prometheus"),
        ("--state", "{s}", "down"),  # make down
        ("--servers", "upstream", "down", "--state", "{s}"),
        ("down", "--servers", "debian", "--state", "{s}"),
    ],
)
def test_commands_on_a_state_not_set_up(tmp_path, argv):
    r = stackctl(*(a.format(s=tmp_path) for a in argv))
    assert (r.returncode, r.stdout, r.stderr) == (0, f"not set up in {tmp_path} (make up)\n", "")


@pytest.mark.parametrize(
    "argv, error",
    [
        ((), "required: COMMAND"),
        (("--servers", "bogus", "status"), "invalid choice: 'bogus'"),
        (("fleet-cert", "--host", "db7"), "required: --address"),
        (("render", "--port", "nod=1"), "--port nod=1: expected NAME=PORT with NAME in prometheus"),
        (("up", "--tls-cert", "x"), "--tls-cert and --tls-key go together"),
        (("status", "--role", "agent"), "unrecognized arguments: --role agent"),
    ],
)
def test_usage_errors_exit_2(tmp_path, argv, error):
    r = stackctl("--state", str(tmp_path / "state"), *argv)
    assert r.returncode == 2 and error in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()  # nothing rendered or started


def test_fleet_cert_issues_a_hosts_bundle(tmp_path):
    """docs/fleet.md's `stackctl.py fleet-cert --host db7 --address 10.0.0.17`."""
    r = stackctl("fleet-cert", "--host", "db7", "--address", "10.0.0.17", "--state", str(tmp_path))
    bundle = tmp_path / "secrets" / "fleet" / "hosts" / "db7"
    assert r.returncode == 0 and f"copy the files in {bundle} " in r.stdout, r.stdout + r.stderr
    assert sorted(os.listdir(bundle)) == [
        "ca.crt",
        "db7.crt",
        "db7.key",
        "push-password",
        "scrape-password.bcrypt",
    ]
