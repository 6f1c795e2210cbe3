"""The committed JSON is exactly what the generator writes (CI: generate, then diff)."""

import difflib
import subprocess
import sys

import blockstack_dashboard


def test_committed_json_is_the_generated_one(tmp_path):
    out = tmp_path / "block-stack-merges.json"
    subprocess.run(
        [sys.executable, blockstack_dashboard.__file__, "--output", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    with open(blockstack_dashboard.OUTPUT) as f:
        committed = f.read()
    generated = out.read_text()
    diff = "".join(
        difflib.unified_diff(
            committed.splitlines(True),
            generated.splitlines(True),
            "dashboards/block-stack-merges.json (committed)",
            "generated",
        )
    )
    assert not diff, f"the committed dashboard is stale; run `make generate`:\n{diff}"


def test_check_mode_passes_on_the_committed_json():
    r = subprocess.run(
        [sys.executable, blockstack_dashboard.__file__, "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_check_mode_fails_on_a_stale_json(tmp_path):
    stale = tmp_path / "stale.json"
    stale.write_text(
        blockstack_dashboard.render().replace("Block Stack Merges", "Block Stack Merge", 1)
    )
    r = subprocess.run(
        [sys.executable, blockstack_dashboard.__file__, "--check", "--output", str(stale)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "make generate" in r.stderr
