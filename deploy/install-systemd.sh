#!/usr/bin/env bash
# Installs deploy/systemd/*.service for production hosts (not used by the tests):
#   make install-systemd [STATE_DIR=/var/lib/blockstack-merges]
# Renders the configuration into STATE_DIR once with stackctl, fills @REPO@/@STATE@ into the
# units, installs them into /etc/systemd/system and enables them. Grafana, if wanted, runs from
# its own package's unit with deploy/grafana/provisioning.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
state=${STATE_DIR:-/var/lib/blockstack-merges}
command -v systemctl >/dev/null || { echo "systemd is not available here" >&2; exit 1; }
mkdir -p "$state/data"
"$repo/.venv/bin/python" "$repo/deploy/stackctl.py" render --state "$state"
for unit in "$repo"/deploy/systemd/*.service; do
  sed -e "s|@REPO@|$repo|g" -e "s|@STATE@|$state|g" "$unit" > "/etc/systemd/system/$(basename "$unit")"
done
systemctl daemon-reload
systemctl enable --now $(cd "$repo/deploy/systemd" && ls *.service)
echo "installed: $(cd "$repo/deploy/systemd" && ls *.service | tr '\n' ' ')"
