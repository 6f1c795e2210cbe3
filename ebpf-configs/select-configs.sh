#!/usr/bin/env bash
# Prints, comma-separated, the configs this kernel can load: the value for ebpf_exporter's
# --config.names. Each line of CANDIDATES is one set of metrics; where it lists variants, the
# first that passes `ebpf_exporter --config.check --config.strict` wins. A set none of whose
# variants loads is left out, with a warning on stderr naming each variant's error.
#
#   ebpf-configs/select-configs.sh EBPF_EXPORTER CONFIG_DIR [STATUS_FILE]
#   e.g. ebpf-configs/select-configs.sh .build/bin/ebpf_exporter .build/ebpf-configs
#
# STATUS_FILE, if given, gets one line per set, tab-separated: the set, the config chosen ("-" if
# none) and why each variant before it did not load ("NAME: error; ..."): blockstack-exporter's
# --ebpf.status-file turns it into blockstack_ebpf_set_loaded and _variant_failed_info.
# SELECT_CONFIGS_AS, if set, is a command prefix (blank-separated words) the checks run under: the
# identity ebpf_exporter will have (deploy/blockstack_deploy/stack.py passes setpriv with its user
# and capabilities), so that a config is chosen only if that identity can load and attach it (a
# Debian kernel's perf_event_paranoid=3 refuses a CPU-wide perf event without CAP_SYS_ADMIN, and
# libbpf finds a module's BTF, jbd2's for the fexit variant, only with CAP_SYS_ADMIN).
# BTF_PATH, if set, is passed as --btf.path (an external BTF file for a kernel without
# /sys/kernel/btf/vmlinux); the stack passes the same to ebpf_exporter.
# Exit status 0 even when a set does not load: the caller decides (make up starts the rest).
set -euo pipefail

CANDIDATES=(
  # Bio and request sizes, latency, merges, missed merges, splits: one program per tracepoint.
  # block_io batches the histograms per CPU (flushed within 0.5 s by a BPF timer; bpf_loop:
  # Linux 5.17+); block_io_immediate updates them at each event (Linux 5.10+), at ~1.5x the BPF
  # time per I/O.
  "block: block_io block_io_immediate"
  # fentry/fexit times add_transaction_credits exactly; the tracepoint variants bracket
  # start_this_handle: ext4_journal_start_sb/_inode (6.2+: tp_btf, or raw tracepoints where the
  # modules' BTF is out of reach without CAP_SYS_ADMIN) or ext4_journal_start (5.10-6.1, raw).
  # Same metric from all four.
  "jbd2: jbd2_credit_wait_fexit jbd2_credit_wait jbd2_credit_wait_raw jbd2_credit_wait_legacy"
)

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 EBPF_EXPORTER CONFIG_DIR [STATUS_FILE]" >&2
  exit 2
fi
exporter=$1
config_dir=$2
status_file=${3:-}
btf_args=()
[ -z "${BTF_PATH:-}" ] || btf_args=("--btf.path=$BTF_PATH")
as=()
[ -z "${SELECT_CONFIGS_AS:-}" ] || read -ra as <<<"$SELECT_CONFIGS_AS"

# Loads and attaches every program of the config, then exits; bounded in time
# ($SELECT_CONFIGS_TIMEOUT seconds, default 60; the VM lab's emulated CPU needs more). Prints
# the loader's output.
check() {
  OTEL_TRACES_EXPORTER=none timeout "${SELECT_CONFIGS_TIMEOUT:-60}" "${as[@]}" "$exporter" --config.dir="$config_dir" \
    --config.names="$1" "${btf_args[@]}" --config.check --config.strict 2>&1
}

# The line of the loader's output that says why: libbpf's first complaint about a program or a
# map or an attach point that is not there, else the exporter's own last words; timestamps dropped, one line of at most 240 characters.
why() {
  local line
  line=$(grep -m1 -E "libbpf: (prog|map) '[^']+': .*(fail|invalid|not|unknown|error)|Failed to attach program" <<<"$1" ||
         grep -E '[^[:space:]]' <<<"$1" | tail -1 || true)
  line=$(sed -E 's/^[0-9]{4}\/[0-9]{2}\/[0-9]{2} [0-9:]{8} //; s/^libbpf \[[a-z]+\]: //; s/[[:space:]]+/ /g' <<<"$line")
  echo "${line:0:240}"
}

if [ -z "${BTF_PATH:-}" ] && [ ! -e /sys/kernel/btf/vmlinux ]; then
  echo "select-configs: this kernel has no BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF):" \
    "every config needs it; set BTF_PATH to an external BTF file for this kernel" >&2
fi

selected=()
status=""
for line in "${CANDIDATES[@]}"; do
  set_name=${line%%:*}
  chosen=""
  failures=""
  for name in ${line#*:}; do
    if [ ! -f "$config_dir/$name.yaml" ]; then
      failures+="${failures:+; }$name: not built in $config_dir"
      continue
    fi
    if output=$(check "$name"); then
      chosen=$name
      break
    fi
    reason=$(why "$output")
    [ -n "$reason" ] || reason="timed out after ${SELECT_CONFIGS_TIMEOUT:-60} s"
    [ -e /sys/kernel/btf/vmlinux ] || [ -n "${BTF_PATH:-}" ] || reason="no kernel BTF; $reason"
    failures+="${failures:+; }$name: $reason"
    echo "select-configs: $name does not load here: $reason" >&2
  done
  if [ -n "$chosen" ]; then
    selected+=("$chosen")
  else
    echo "select-configs: no variant of $set_name [${line#*: }] loads; its metrics will be missing" >&2
  fi
  status+="$set_name"$'\t'"${chosen:--}"$'\t'"${failures//$'\t'/ }"$'\n'
done
if [ -n "$status_file" ]; then
  printf '%s' "$status" >"$status_file.tmp"
  mv "$status_file.tmp" "$status_file"
fi
(IFS=,; echo "${selected[*]}")
