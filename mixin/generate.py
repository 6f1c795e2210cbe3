"""Writes the mixin (mixin/*.libsonnet, out/, prometheus-rule.yaml) from the rule templates, the
knobs of alerts/config.yml and the dashboard generator: blockstack_rules.mixin does the work, given
dashboards/blockstack_dashboard.py's build (`make generate`; `--check`: exit 1 if a file is stale)."""

import sys

import blockstack_dashboard
from blockstack_rules import mixin

if __name__ == "__main__":
    sys.exit(mixin.main(blockstack_dashboard.build))
