"""The committed JSON and docs/dashboard.md's table of the stack table's columns are exactly what
the generator writes (CI: generate, then diff)."""

import difflib
import subprocess
import sys

import blockstack_dashboard


def generate(*args):
    return subprocess.run(
        [sys.executable, blockstack_dashboard.__file__, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_committed_json_and_docs_are_the_generated_ones(tmp_path):
    out, docs = tmp_path / "block-stack-merges.json", tmp_path / "dashboard.md"
    r = generate("--output", str(out), "--docs", str(docs))
    assert r.returncode == 0, r.stdout + r.stderr
    for committed_path, generated in (
        (blockstack_dashboard.OUTPUT, out),
        (blockstack_dashboard.DOCS, docs),
    ):
        with open(committed_path) as f:
            committed = f.read()
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(True),
                generated.read_text().splitlines(True),
                f"{committed_path} (committed)",
                "generated",
            )
        )
        assert not diff, f"{committed_path} is stale; run `make generate`:\n{diff}"


def test_check_mode_passes_on_the_committed_files():
    r = generate("--check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_check_mode_fails_on_a_stale_json(tmp_path):
    stale = tmp_path / "stale.json"
    stale.write_text(
        blockstack_dashboard.render().replace("Block Stack Merges", "Block Stack Merge", 1)
    )
    r = generate("--check", "--output", str(stale))
    assert r.returncode == 1 and "make generate" in r.stderr


def test_check_mode_fails_on_stale_docs(tmp_path):
    """A column missing from docs/dashboard.md's generated table."""
    stale = tmp_path / "dashboard.md"
    stale.write_text(blockstack_dashboard.render_docs().replace("| max_hw_sectors_kb |", "| x |"))
    r = generate("--check", "--docs", str(stale))
    assert r.returncode == 1 and "make generate" in r.stderr and "max_hw_sectors_kb" in r.stdout
