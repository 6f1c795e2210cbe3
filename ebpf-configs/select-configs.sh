#!/usr/bin/env bash
# Prints, comma-separated, the configs this kernel can load: the value for ebpf_exporter's
# --config.names. Each line of CANDIDATES is one set of metrics; where it lists variants, the
# first that passes `ebpf_exporter --config.check --config.strict` wins. A set none of whose
# variants loads is left out, with a warning on stderr.
#
#   ebpf-configs/select-configs.sh EBPF_EXPORTER CONFIG_DIR
#   e.g. ebpf-configs/select-configs.sh .build/bin/ebpf_exporter .build/ebpf-configs
set -euo pipefail

CANDIDATES=(
  # Bio and request sizes, latency, merges, missed merges, splits: one program per tracepoint.
  # block_io batches the histograms per CPU (flushed within 0.5 s; bpf_loop: Linux 5.17+);
  # block_io_immediate updates them at each event, at ~1.5x the BPF time per I/O.
  "block_io block_io_immediate"
  # fentry/fexit times add_transaction_credits exactly; the tracepoint variant brackets
  # start_this_handle and works on kernels that refuse fentry/fexit. Same metric from both.
  "jbd2_credit_wait_fexit jbd2_credit_wait"
)

if [ $# -ne 2 ]; then
  echo "usage: $0 EBPF_EXPORTER CONFIG_DIR" >&2
  exit 2
fi
exporter=$1
config_dir=$2

loads() {
  # Loads and attaches every program of the config, then exits; bounded in time
  # ($SELECT_CONFIGS_TIMEOUT seconds, default 60; the VM lab's emulated CPU needs more).
  OTEL_TRACES_EXPORTER=none timeout "${SELECT_CONFIGS_TIMEOUT:-60}" "$exporter" --config.dir="$config_dir" --config.names="$1" \
    --config.check --config.strict >/dev/null 2>&1
}

selected=()
for set in "${CANDIDATES[@]}"; do
  chosen=""
  for name in $set; do
    if [ -f "$config_dir/$name.yaml" ] && loads "$name"; then
      chosen=$name
      break
    fi
    echo "select-configs: $name does not load here" >&2
  done
  if [ -n "$chosen" ]; then
    selected+=("$chosen")
  else
    echo "select-configs: no variant of [$set] loads; its metrics will be missing" >&2
  fi
done
(IFS=,; echo "${selected[*]}")
