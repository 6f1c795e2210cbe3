"""Static checks of the project's own Python: pyflakes (unused imports and variables, undefined
names, f-strings without placeholders) over every tracked .py file."""
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def test_pyflakes_finds_nothing():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                           check=True, timeout=60).stdout.split()
    assert files
    r = subprocess.run([sys.executable, "-m", "pyflakes", *files], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
