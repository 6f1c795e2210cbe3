"""The knobs: every threshold, window and selector of the rules and the dashboard, from one file.

alerts/config.yml holds them, one comment per knob (node-mixin's config.libsonnet, in YAML).
The rule templates alerts/src/*.rules.yml.in name a knob as ${knob} and are rendered into
alerts/*.rules.yml; the dashboard generator and the fleet's central role read the same knobs.

    python -m blockstack_rules.knobs            # rewrite alerts/*.rules.yml
    python -m blockstack_rules.knobs --check    # exit 1 if a rule file differs from what it would be

An unknown knob is an error here; a knob that no consumer reads fails alerts/tests/test_knobs.py.

Why string.Template and not Jinja2: the rule files are full of Go templates ({{ $labels.device }},
{{ with ... }}{{ end }}) that Prometheus and Alertmanager expand, and Jinja2's {{ }} and {% %} are
the same delimiters, so every annotation would need escaping; `[[ ]]`, used before, is Grafana's
legacy variable syntax. string.Template is in the standard library and its ${knob} appears nowhere
in PromQL or Go templates. Only the braced form is a placeholder here: a bare $ stays as written,
so $labels, $value, $1 of label_replace and Grafana's $__rate_interval need no $$ escape.
"""

import argparse
import difflib
import os
import pathlib
import string
import sys

import yaml

# The project's files: BLOCKSTACK_HOME (as blockstack_deploy.paths), default the checkout this sits in
REPO = pathlib.Path(
    os.environ.get("BLOCKSTACK_HOME") or pathlib.Path(__file__).resolve().parents[2]
)
CONFIG = REPO / "alerts" / "config.yml"
TEMPLATES = REPO / "alerts" / "src"
# What each Prometheus evaluates: a host's (standalone or agent) and the fleet's central watcher.
HOST_RULES = [REPO / "alerts" / "alerts.rules.yml", REPO / "alerts" / "recording.rules.yml"]
FLEET_RULES = REPO / "alerts" / "fleet.rules.yml"


class Knobs(dict):
    """The knobs of config.yml by name; remembers which were read, so unused ones can be found."""

    def __init__(self, values):
        super().__init__(values)
        self.used = set()

    def __getitem__(self, name):
        self.used.add(name)
        return super().__getitem__(name)


def load(path=CONFIG):
    with open(path) as f:
        values = yaml.safe_load(f)
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of knobs")
    return Knobs(values)


class _Template(string.Template):
    # ${knob} only (the named, escaped and invalid groups never match).
    pattern = (
        r"\$(?:(?P<escaped>(?!))|(?P<named>(?!))|\{(?P<braced>[a-z][a-z0-9_]*)\}|(?P<invalid>(?!)))"
    )


def render(text, knobs, name="template"):
    try:
        return _Template(text).substitute(knobs)
    except KeyError as e:
        raise ValueError(f"{name}: unknown knob ${{{e.args[0]}}} (not in {CONFIG.name})") from None


def queue_settings_info(indent=" " * 10):
    """host_device:blockstack_queue_settings:info's expression: one label per queue setting whose
    row in the exporter's table (blockstack_exporter/settings.py) has info_label, in the file's
    unit. Imported here, not at the top: blockstack_exporter imports this package (its knobs),
    and only the rules' rendering needs the exporter's table."""
    from blockstack_exporter import settings

    rows = [s for s in settings.QUEUE if s.info_label]
    labels = [s.file for s in rows]
    counts = [
        f'count_values by (host, device) ("{s.file}", {s.name}{{${{blockstack_selector}}}}'
        + (f" / {s.scale})" if s.scale != 1 else ")")
        for s in rows
    ]
    joined = [counts[0]]
    for label, count in zip(labels[1:], counts[1:]):
        joined += [f"  * on (host, device) group_left ({label})", count]
    unknown = ", ".join(f'"{label}", "unknown", "", "")' for label in labels)
    lines = [
        f"max by (host, device, {', '.join(labels)}) (",
        *("    " + line for line in joined),
        "  or on (host, device)",
        "    " + "label_replace(" * len(labels),
        "      host_device:blockstack_stack:info,",
        "    " + unknown,
        ")",
    ]
    return ("\n" + indent).join(lines)


# The device map as the rules join it (the dashboard joins it plainly: alerts/README.md): for each device number the newest of
# its series, the name of now. After a restart Prometheus has no staleness marker for the series
# it scraped or recorded before: they stay visible for the lookback (5 min), and a number renamed
# meanwhile would have two names and fail every group_left on the map (duplicate series).
DEVNO_NAMES = (
    "(host_devno:blockstack_device:info"
    " and topk by (host, devno) (1, timestamp(host_devno:blockstack_device:info)))"
)


def template_text(path):
    """A rule template's text with its parts made from the exporter's tables filled in
    (${queue_settings_info}) and the device map (${devno_names}); its knobs are still to render."""
    return (
        path.read_text()
        .replace("${queue_settings_info}", queue_settings_info())
        .replace("${devno_names}", DEVNO_NAMES)
    )


def rule_files(knobs, **overrides):
    """{output path: text} for every rule template; overrides replace knobs (the fleet test's
    short host-down `for:`)."""
    values = Knobs({**knobs, **overrides})
    out = {}
    for template in sorted(TEMPLATES.glob("*.rules.yml.in")):
        text = render(template_text(template), values, template.name)
        yaml.safe_load(text)  # fail here, not in promtool, on broken YAML
        header = (
            f"# GENERATED from alerts/src/{template.name} with the knobs of alerts/config.yml.\n"
            "# Do not edit: change the template or the knob, then run `make generate`.\n"
        )
        out[REPO / "alerts" / template.name[: -len(".in")]] = header + text
    knobs.used |= values.used
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a rule file is stale")
    args = p.parse_args(argv)
    return write_or_check(rule_files(load()), args.check)


def write_or_check(files, check, show=lambda path: path.relative_to(REPO)):
    """Writes {path: text} where a file differs (`make generate`); with check, writes nothing,
    prints each stale file's diff and returns 1 if any is stale (the tests, `--check`)."""
    stale = []
    for path, text in files.items():
        old = path.read_text() if path.exists() else ""
        if old == text:
            continue
        if check:
            stale.append(str(show(path)))
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(True),
                    text.splitlines(True),
                    f"{show(path)} (committed)",
                    "generated",
                    n=1,
                )
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f">> wrote {show(path)}")
    if stale:
        print(f"stale: {', '.join(stale)}; run `make generate`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
