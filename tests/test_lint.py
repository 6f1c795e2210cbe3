"""Static checks of the project's own Python: ruff's lint (pyflakes, pycodestyle's errors, import
order, bugbear; ruff.toml) and ruff's formatter, over every tracked .py file. `make format`
rewrites what the second test finds."""

import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RUFF = os.path.join(os.path.dirname(sys.executable), "ruff")


def tracked_python():
    files = subprocess.run(
        ["git", "ls-files", "*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert files
    return files


def test_ruff_check_finds_nothing():
    r = subprocess.run(
        [RUFF, "check", "--no-cache", *tracked_python()],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_changes_nothing():
    r = subprocess.run(
        [RUFF, "format", "--check", "--no-cache", *tracked_python()],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
