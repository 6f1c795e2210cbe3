"""The knobs (thresholds) the findings use, from the project's alerts/config.yml.

The package ships that very file (blockstack_exporter/config.yml is a symbolic link to
alerts/config.yml in the repository; building the package copies its content), so an exporter
or doctor installed anywhere judges with the thresholds its alerts were generated from.
`--config.knobs PATH` reads an operator's own config.yml instead, the one their rules were
generated from (`make generate`): the doctor, the exporter's blockstack_finding and the alerts
then cannot disagree. The file is read as the rules generator reads it (blockstack_rules.knobs);
the checks' knobs must be numbers besides.
"""

import os

import yaml

from blockstack_rules import knobs as rules_knobs

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.yml")


class KnobsError(Exception):
    """The knobs file is missing, not YAML, or lacks a knob the checks read."""


def load(path=None, required=()):
    """{knob: value} from path (default: the shipped file); KnobsError names what is wrong."""
    path = path or SHIPPED
    try:
        values = rules_knobs.load(path)  # the rules generator's reading of the same file
    except (OSError, yaml.YAMLError) as e:
        raise KnobsError(f"{path}: {e}") from None
    except ValueError as e:  # not a mapping: the message names the path
        raise KnobsError(str(e)) from None
    missing = sorted(set(required) - set(values))
    if missing:
        raise KnobsError(f"{path}: missing knobs {', '.join(missing)}")
    for name in required:
        if isinstance(values[name], bool) or not isinstance(values[name], (int, float)):
            raise KnobsError(f"{path}: knob {name} is not a number: {values[name]!r}")
    return values
