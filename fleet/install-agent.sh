#!/usr/bin/env bash
# Installs the fleet agent role on this host as systemd units (docs/fleet.md "Rolling out"):
#   fleet/install-agent.sh --host db1 --listen 10.0.0.11 --alertmanager 10.0.0.5:9093 --alertmanager 10.0.0.6:9093 \
#       [--replica A --replica B] [--fleet-secrets /etc/blockstack-fleet]
# Needs: make deps venv ebpf-build thanos; the fleet secrets (ca.crt, HOST.crt/.key, fleet-password)
# copied from the central side (stackctl.py fleet-cert). Renders the configuration into STATE_DIR,
# installs the exporters' units from deploy/systemd and one Prometheus + sidecar unit per replica.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
state=${STATE_DIR:-/var/lib/blockstack-merges}
command -v systemctl >/dev/null || { echo "systemd is not available here" >&2; exit 1; }
args=("$@")
host=$(hostname); listen=""; secrets="$state/secrets/fleet"; replicas=()
while [ $# -gt 0 ]; do
  case "$1" in
    --host) host=$2; shift 2 ;;
    --listen) listen=$2; shift 2 ;;
    --fleet-secrets) secrets=$2; shift 2 ;;
    --replica) replicas+=("$2"); shift 2 ;;
    *) shift ;;
  esac
done
[ -n "$listen" ] || { echo "--listen ADDR (the address the central side reaches this host on) is required" >&2; exit 2; }
[ ${#replicas[@]} -gt 0 ] || replicas=(A)
mkdir -p "$state/data"
"$repo/.venv/bin/python" "$repo/deploy/stackctl.py" render --state "$state" --role agent "${args[@]}"
id blockstack-agent >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin blockstack-agent
ports=$(cat "$state/ports.json")
port() { "$repo/.venv/bin/python" -c "import json,sys; print(json.load(sys.stdin)['$1'])" <<<"$ports"; }
subst=(-e "s|@REPO@|$repo|g" -e "s|@STATE@|$state|g" -e "s|@LISTEN@|$listen|g" -e "s|@HOST@|$host|g" -e "s|@SECRETS@|$secrets|g")
for r in "${replicas[@]}"; do
  install -d -o blockstack-agent -g blockstack-agent "$state/data/prometheus-$r"
  subst+=(-e "s|@PROM_PORT_$r@|$(port "prometheus-$r")|g" -e "s|@GRPC_PORT_$r@|$(port "sidecar-$r-grpc")|g"
          -e "s|@HTTP_PORT_$r@|$(port "sidecar-$r-http")|g")
done
# %i stays in the installed templates; the placeholders per replica are resolved into drop-ins.
for unit in blockstack-agent-prometheus@ blockstack-thanos-sidecar@; do
  for r in "${replicas[@]}"; do
    sed -e "s|%i|$r|g" "${subst[@]}" "$repo/fleet/systemd/$unit.service" > "/etc/systemd/system/${unit}$r.service"
  done
done
chown blockstack-agent "$secrets/$host.key" "$secrets/fleet-password" "$state/config/web-config.yml"
for unit in blockstack-node-exporter blockstack-exporter blockstack-ebpf-exporter; do
  sed -e "s|@REPO@|$repo|g" -e "s|@STATE@|$state|g" "$repo/deploy/systemd/$unit.service" > "/etc/systemd/system/$unit.service"
done
systemctl daemon-reload
units="blockstack-node-exporter blockstack-exporter blockstack-ebpf-exporter"
for r in "${replicas[@]}"; do units="$units blockstack-agent-prometheus@$r blockstack-thanos-sidecar@$r"; done
systemctl enable --now $units
echo "installed: $units"
