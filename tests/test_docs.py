"""The docs name what the code has: every alert, recording rule, metric, knob and make target a
Markdown file names exists under that name today (and a runbook section is an alert's)."""

import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Every Markdown file we write, docs/metrics.md included: generated from the exporters (its own
# test keeps it current), its tables quote the checks' knobs and alerts.
DOCS = sorted(
    p
    for p in ROOT.glob("**/*.md")
    if not any(
        part.startswith(".") or part in ("node_modules", "fixtures")
        for part in p.relative_to(ROOT).parts
    )
)
PACKAGES = {
    "blockstack_exporter",
    "blockstack_deploy",
    "blockstack_lab",
    "blockstack_rules",
    "blockstack_dashboard",
    "blockstack_http",
    "blockstack_testsupport",
}


def rules():
    for path in sorted((ROOT / "alerts").glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from group["rules"]


ALERTS = {r["alert"] for r in rules() if "alert" in r}
RECORDS = {r["record"] for r in rules() if "record" in r}
KNOBS = yaml.safe_load((ROOT / "alerts" / "config.yml").read_text())


def metrics():
    """Every metric docs/metrics.md lists, with a histogram's series."""
    names = set(
        re.findall(r"^\| `([a-z_:0-9]+)`", (ROOT / "docs" / "metrics.md").read_text(), re.M)
    )
    return names | {n + s for n in names for s in ("_bucket", "_sum", "_count")}


def make_targets():
    return set(re.findall(r"^([a-z0-9][a-z0-9-]*)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M))


def found(pattern, allowed, code_pattern=None):
    """[file:line: name] of every match of pattern (group 1) in the docs that `allowed` refuses;
    code_pattern instead on the lines of code blocks (fenced or indented)."""
    out = []
    for path in DOCS:
        fenced = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            fenced ^= line.startswith("```")
            code = fenced or line.startswith("    ")
            out += [
                f"{path.relative_to(ROOT)}:{number}: {m.group(1)}"
                for m in re.finditer(code_pattern if code and code_pattern else pattern, line)
                if not allowed(m.group(1))
            ]
    return out


def test_the_checks_see_the_code():
    assert "BlockStackMergeCollapse" in ALERTS and "host_device:blockstack_stack:info" in RECORDS
    assert (
        "blockstack_queue_nomerges" in metrics()
        and "ebpf_exporter_block_rq_size_bytes_bucket" in metrics()
    )
    assert "rate_window" in KNOBS and {"test", "test-unit", "up", "generate"} <= make_targets()
    assert ROOT / "README.md" in DOCS and ROOT / "docs" / "runbook.md" in DOCS


def test_alert_names_in_the_docs_are_alerts():
    assert not found(r"\b(BlockStack[A-Z][A-Za-z0-9]+)", ALERTS.__contains__)


@pytest.mark.parametrize("doc", ["runbook.md", "fleet.md"])
def test_runbook_sections_are_alerts(doc):
    """A section named like an alert is an alert's (runbook_url anchors; test_alerts.py checks
    the other direction: every alert has its section)."""
    headings = re.findall(r"^#+ (BlockStack\w+)", (ROOT / "docs" / doc).read_text(), re.M)
    assert headings and set(headings) <= ALERTS, set(headings) - ALERTS


def test_recording_rule_names_in_the_docs_are_rules():
    assert not found(
        r"\b((?:host|device|instance)[a-z_]*:[a-z0-9_]+:[a-z0-9_]+)\b", RECORDS.__contains__
    )


def test_metric_names_in_the_docs_are_served():
    """blockstack_* and ebpf_exporter_* names: a metric of docs/metrics.md, a family prefix of some
    (`blockstack_dm_snapshot_*`), a knob or a Python package; recording rules are checked above."""
    served = metrics()

    def allowed(name):
        if name.endswith("_"):
            return any(m.startswith(name) for m in served)
        return name in served or name in KNOBS or name in PACKAGES

    # a name inside a recording rule's name (level:metric:operation) is the rule's, not a metric
    assert not found(r"(?<![:\w])((?:blockstack|ebpf_exporter)_[a-z0-9_]+)(?![:\w])", allowed)


def test_knobs_quoted_with_a_value_have_that_value():
    """`knob: value` in the docs is what alerts/config.yml says."""

    def allowed(quote):
        name, value = quote.split(":", 1)
        return name not in KNOBS or str(KNOBS[name]) == value.strip()

    assert not found(r"`([a-z_]+: [^`]+)`", allowed)


def test_make_targets_in_the_docs_exist():
    """`make TARGET` quoted, or in a code block (`make bench-*` is a prefix of some)."""
    targets = make_targets()

    def allowed(target):
        if target.endswith("-*"):
            return any(t.startswith(target[:-1]) for t in targets)
        return target in targets

    target = r"make (?:-s )?([a-z][a-z0-9]*(?:-[a-z0-9]+)*(?:-\*)?)"
    assert not found("`" + target, allowed, code_pattern=r"(?:^\s*|\$ |&& )" + target)


def test_readme_kernel_table_is_what_the_matrix_loads():
    """docs/kernels.md's kernel table names, per kernel, the BPF programs that the VM tier asserts
    select-configs.sh chooses there (vm_scenarios.EXPECTED_CONFIGS); ebpf-configs/README.md's
    table the same."""
    from blockstack_lab.vm_scenarios import EXPECTED_CONFIGS

    def programs(path, columns):
        """{kernel: {config named in those columns}} of a table whose rows start "| 5.10 (" etc."""
        rows = {}
        for line in (ROOT / path).read_text().splitlines():
            m = re.match(r"\| (5\.10|6\.1|6\.12|7\.2) \(", line)
            if m:
                cells = line.strip("|").split(" | ")
                named = re.findall(r"`([a-z0-9_]+)`", " ".join(cells[c] for c in columns))
                rows["sid" if m[1] == "7.2" else m[1]] = set(named)
        return rows

    for path, columns in (("docs/kernels.md", [2]), ("ebpf-configs/README.md", [1, 2])):
        rows = programs(path, columns)
        assert set(rows) == set(EXPECTED_CONFIGS), (path, rows)
        for kernel, configs in EXPECTED_CONFIGS.items():
            assert rows[kernel] == set(configs.split(",")), (path, kernel, rows[kernel])
