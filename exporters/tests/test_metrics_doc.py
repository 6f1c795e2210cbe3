"""docs/metrics.md is what metrics_doc.py generates from the exporters today: a metric, HELP
string, label or ebpf-configs YAML changed without `make metrics-doc` fails here."""
import difflib

from metrics_doc import OUTPUT, render


def test_metrics_doc_is_current():
    with open(OUTPUT) as f:
        committed = f.read()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), render().splitlines(True),
                                        "docs/metrics.md", "generated"))
    assert not diff, "docs/metrics.md is stale: run `make metrics-doc`\n" + diff
