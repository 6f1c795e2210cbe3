#!/usr/bin/env bash
# Installs the Debian packages the stack and its tests need. Idempotent: a no-op when all are present.
set -euo pipefail
packages=(
  prometheus prometheus-alertmanager prometheus-node-exporter   # the servers (2.42, 0.25, 1.5)
  fio sysstat                                                   # load generator, iostat cross-check
  linux-perf                                                    # make bench-ebpf: the BPF share of a read's CPU
  clang llvm bpftool libelf-dev zlib1g-dev pkg-config make      # the libbpf build, upstream's examples
  clang-16                                                      # BPF programs: bpf_core_type_matches needs clang 15+
  clang-format                                                  # the BPF sources' format check
  e2fsprogs util-linux fdisk kmod iproute2                      # mkfs.ext4, losetup, sfdisk; ip netns, ss
  systemd                                                       # systemd-analyze verify of the rendered units
  chromium fonts-liberation                                     # the dashboard's browser test and screenshot (playwright drives it)
  dpkg-dev lintian                                              # make deb: dpkg-shlibdeps, and its test's lintian
  python3-prometheus-client python3-yaml python3-bcrypt         # the Debian package's Python libraries (its test runs on them)
  podman runc mmdebstrap                                        # the chart's image and its pod, run as the kubelet would (charts/)
  exim4-daemon-light                                            # the mail server of alerts/tests/test_delivery.py (its own instance); Debian's exim4 service listens on 127.0.0.1:25 and ::1 only
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo ">> apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian's packages start their daemons where an init system runs; the stack runs its own copies.
for svc in prometheus prometheus-alertmanager prometheus-node-exporter; do
  if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
  fi
done
