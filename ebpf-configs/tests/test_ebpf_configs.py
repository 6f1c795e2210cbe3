"""Static checks of every config (no root: `make test-unit`), then `ebpf_exporter --config.check
--config.strict` on each (root).

The programs are compiled with -Wall -Werror by `make ebpf-objects` (ebpf-configs/Makefile), which
`make test-unit` and `make test` run first; these tests check what the build produced.
"""

import json
import os
import re
import subprocess

import jsonschema
import pytest
import yaml
from ebpf_testlib import (
    BUILD,
    CONFIG_DIR,
    CONFIGS_SRC,
    EXPORTER,
    FLUSH_PERIOD,
    SELECT,
    cannot_load,
    config_check,
    config_names,
    selected_configs,
)

SCHEMA = os.path.join(BUILD, "share", "ebpf_exporter", "config-schema.yaml")
NAMES = config_names()


def test_every_program_has_a_config():
    programs = sorted(f[: -len(".bpf.c")] for f in os.listdir(CONFIGS_SRC) if f.endswith(".bpf.c"))
    assert programs == NAMES


def test_sources_are_clang_formatted():
    """Like upstream's CI: `clang-format --dry-run -Werror` with ebpf-configs/.clang-format."""
    sources = sorted(f for f in os.listdir(CONFIGS_SRC) if f.endswith((".bpf.c", ".bpf.h")))
    r = subprocess.run(
        ["clang-format", "--dry-run", "-Werror", *sources],
        cwd=CONFIGS_SRC,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, f"run clang-format -i in ebpf-configs/:\n{r.stderr}"


def test_cannot_load_list_names_real_configs_with_reasons():
    for name, (error, reason) in cannot_load().items():
        assert name in NAMES, f"cannot-load.txt names {name}, which is not a config"
        assert error and len(reason) > 20, f"cannot-load.txt: {name} needs an error and a reason"


# --- JSON schema --------------------------------------------------------------------------------
# Upstream's schema, installed by scripts/build-ebpf-exporter.sh from the ebpf_exporter module.
def schema_errors(value):
    with open(SCHEMA) as f:
        schema = yaml.safe_load(f)
    validator = jsonschema.validators.validator_for(schema)(schema)
    return sorted(f"{e.json_path}: {e.message}" for e in validator.iter_errors(value))


def load_config(name):
    with open(os.path.join(CONFIGS_SRC, name + ".yaml")) as f:
        return yaml.safe_load(f)


def test_schema_validator_rejects_bad_configs():
    assert schema_errors(load_config("block_io")) == []
    bad = load_config("block_io")
    bad["metrics"]["histograms"][0]["bucket_type"] = "log10"
    del bad["metrics"]["counters"][0]["help"]
    bad["metrics"]["counters"][1]["labels"][0]["decoders"][0]["name"] = "majorminr"
    errors = schema_errors(bad)
    assert len(errors) == 3, errors


@pytest.mark.parametrize("name", NAMES)
def test_yaml_matches_upstream_schema(name):
    assert schema_errors(load_config(name)) == []


# --- maps in the objects against the YAML ---------------------------------------------------------
def btf_types(obj):
    out = subprocess.run(
        ["bpftool", "-j", "btf", "dump", "file", obj],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return {t["id"]: t for t in json.loads(out)["types"]}


def type_size(types, type_id):
    t = types[type_id]
    while t["kind"] in ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"):
        t = types[t["type_id"]]
    return t["size"]


def map_key_value_sizes(types, map_name):
    """Key and value size of the map variable `map_name` in a libbpf-style .maps section."""
    for t in types.values():
        if t["kind"] == "VAR" and t["name"] == map_name:
            members = {m["name"]: m["type_id"] for m in types[t["type_id"]]["members"]}
            # __type(key, T) is a member `T *key`.
            return (
                type_size(types, types[members["key"]]["type_id"]),
                type_size(types, types[members["value"]]["type_id"]),
            )
    return None


@pytest.mark.parametrize("name", NAMES)
def test_each_metric_has_its_map_with_matching_key_layout(name):
    """The map is named like the metric; its key is exactly the labels' bytes, its value a u64
    (ebpf_exporter decodes labels from the key's bytes in order, `size` then `padding` each)."""
    types = btf_types(os.path.join(CONFIG_DIR, name + ".bpf.o"))
    metrics = load_config(name)["metrics"]
    for metric in metrics.get("counters", []) + metrics.get("histograms", []):
        sizes = map_key_value_sizes(types, metric["name"])
        assert sizes is not None, f"{name}.bpf.o has no map named {metric['name']}"
        key_size, value_size = sizes
        label_bytes = sum(label["size"] + label.get("padding", 0) for label in metric["labels"])
        assert key_size == label_bytes, (
            f"{metric['name']}: key is {key_size} bytes, labels take {label_bytes}"
        )
        assert value_size == 8


# --- the buckets of the C source against the YAML ---------------------------------------------------
def source_with_includes(path, seen=None):
    """The text of a source and of every "quoted" header it includes (recursively), once each."""
    seen = set() if seen is None else seen
    if path in seen:
        return ""
    seen.add(path)
    with open(path) as f:
        text = f.read()
    headers = re.findall(r'^#include "([^"]+)"', text, re.M)
    return text + "".join(source_with_includes(os.path.join(CONFIGS_SRC, h), seen) for h in headers)


def defines(text):
    """{NAME: int} of the #defines whose value is a plain integer."""
    return {
        name: int(value, 0)
        for name, value in re.findall(r"^#define\s+(\w+)\s+(\d+|0x[0-9a-fA-F]+)\s*$", text, re.M)
    }


def observed_buckets(text):
    """{map: {(min, max), ...}} of every call that passes a map and its bucket bounds, in that order:
    histogram_observe(&map, key, value, min, max) and block_io's observe(), pending_add() and
    flush_hist(), whose bounds are the #defines named *_BUCKET_MIN and *_BUCKET_MAX."""
    consts = defines(text)
    calls = re.findall(
        r"\w+\(\s*&(\w+)\s*,[^;{]*?\b(\w+_BUCKET_MIN)\s*,\s*(\w+_BUCKET_MAX)\b", text
    )
    out = {}
    for map_name, low, high in calls:
        out.setdefault(map_name, set()).add(
            tuple(consts[v] if v in consts else int(v, 0) for v in (low, high))
        )
    return out


@pytest.mark.parametrize("name", NAMES)
def test_bucket_defines_match_the_yaml(name):
    """The bucket bounds a program observes with (its #defines, "Must match bucket_min /
    bucket_max") are the histogram's bucket_min and bucket_max in NAME.yaml: else ebpf_exporter
    labels every bucket with the wrong le."""
    observed = observed_buckets(source_with_includes(os.path.join(CONFIGS_SRC, name + ".bpf.c")))
    for histogram in load_config(name)["metrics"].get("histograms", []):
        assert histogram["name"] in observed, f"{name}.bpf.c never observes {histogram['name']}"
        assert observed[histogram["name"]] == {
            (histogram["bucket_min"], histogram["bucket_max"])
        }, (
            f"{histogram['name']}: the source observes with {observed[histogram['name']]}, "
            f"{name}.yaml says bucket_min {histogram['bucket_min']}, bucket_max {histogram['bucket_max']}"
        )


def test_bucket_check_reads_the_source():
    """The check above finds a mismatch: a changed #define is seen."""
    text = source_with_includes(os.path.join(CONFIGS_SRC, "block_io.bpf.c"))
    assert observed_buckets(text)["block_rq_size_bytes"] == {(9, 27)}
    changed = re.sub(
        r"^#define SIZE_BUCKET_MAX \d+", "#define SIZE_BUCKET_MAX 26", text, flags=re.M
    )
    assert observed_buckets(changed)["block_rq_size_bytes"] == {(9, 26)}


@pytest.mark.parametrize(
    "first, second",
    [
        ("jbd2_credit_wait", "jbd2_credit_wait_fexit"),
        ("jbd2_credit_wait", "jbd2_credit_wait_legacy"),
        ("jbd2_credit_wait", "jbd2_credit_wait_raw"),
        ("block_io", "block_io_immediate"),
    ],
)
def test_variants_export_the_same_metrics(first, second):
    """Dashboards and alerts work with either variant only if both define the metrics alike."""
    assert load_config(first)["metrics"] == load_config(second)["metrics"]


def test_histogram_help_states_the_flush_period():
    """block_io's HELP strings (and so docs/metrics.md) give the lag of its batched histograms;
    a change of FLUSH_NS (block_batched.bpf.h) must change them too."""
    for histogram in load_config("block_io")["metrics"]["histograms"]:
        assert f"within {FLUSH_PERIOD:g} s of the I/O" in histogram["help"], histogram["name"]


# --- the real exporter loads them -----------------------------------------------------------------
@pytest.mark.root
@pytest.mark.parametrize("name", NAMES)
def test_config_check_strict(name):
    result = config_check(name)
    output = result.stdout + result.stderr
    reasons = cannot_load()
    if result.returncode != 0 and name in reasons:
        # listed in cannot-load.txt: it must fail for the documented reason (the kernel refusing
        # the program, or an attach point it lacks), not for a bug of ours such as a bad map
        assert reasons[name][0] in output.lower(), output
        return
    assert result.returncode == 0, output
    assert "Config check successful" in output


@pytest.mark.root
def test_selected_configs_load_together_and_cover_every_metric_set():
    names = selected_configs().split(",")
    assert "block_io" in names
    assert len({n for n in names if n.startswith("jbd2_credit_wait")}) == 1, names
    result = config_check(",".join(names))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.root
def test_select_configs_status_says_what_loads_and_why_not(tmp_path):
    """select-configs.sh's STATUS_FILE (blockstack-exporter's --collector.ebpf.status-file): a line
    per set, the variant chosen or "-", and each failed variant's loader error. Here "block_io" is
    a program whose tracepoint this kernel lacks (jbd2_credit_wait_legacy's object under that
    name: a real loader error) and block_io_immediate is not built, so the block set loads
    nothing; the jbd2 set loads as usual. The exit status stays 0: the caller decides."""
    for src, dst in (
        ("jbd2_credit_wait_legacy", "block_io"),
        *((n, n) for n in NAMES if n.startswith("jbd2")),
    ):
        for ext in (".bpf.o", ".yaml"):
            os.symlink(os.path.join(CONFIG_DIR, src + ext), tmp_path / (dst + ext))
    status = tmp_path / "status.tsv"
    r = subprocess.run(
        [SELECT, EXPORTER, str(tmp_path), str(status)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in status.read_text().splitlines()}
    assert set(rows) == {"block", "jbd2"}
    chosen, failures = rows["block"]
    assert chosen == "-"
    assert (
        "block_io: libbpf: prog 'ext4_journal_start': failed to attach to raw tracepoint 'ext4_journal_start': "
        "No such file or directory" in failures
    ), failures
    assert f"block_io_immediate: not built in {tmp_path}" in failures
    assert rows["jbd2"][0] in NAMES and rows["jbd2"][0] == r.stdout.strip(), (rows, r.stdout)
    assert "no variant of block [block_io block_io_immediate] loads" in r.stderr
