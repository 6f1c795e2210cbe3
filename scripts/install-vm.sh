#!/usr/bin/env bash
# Installs what the VM lab (lab/blockstack_lab/vm.py, `make vm-lab`, the `vm` test tier) needs from
# Debian: QEMU (software emulation: the guest boots under -accel tcg), busybox-static (virtme-ng builds the
# guest's initramfs from it), LVM2 (the guest runs the host's binaries over a read-only view of its
# root) and the four Debian kernels the lab boots: 6.1 (linux-image-amd64) and 6.12 (the newest
# linux-image-6.12.*+deb12-amd64) installed from the host's apt sources, 5.10 (Debian 11) and sid's newest
# unpacked by scripts/fetch-kernel.sh from a private apt configuration; mmdebstrap, qemu-img and
# dpkg-scanpackages for the Debian host (debian_host.py). virtme-ng itself comes from PyPI
# into .venv (requirements.in, locked with hashes in requirements.txt).
# Idempotent: a no-op when all are present.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
packages=(qemu-system-x86 busybox-static lvm2 linux-image-amd64
          mdadm cryptsetup-bin thin-provisioning-tools  # vm_stacks.py: md RAID, dm-crypt, LVM thin pools
          mmdebstrap qemu-utils dpkg-dev)  # debian_host.py: the Debian 12 image, its qcow2 overlays, its local apt repo
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
# 6.12: a versioned package (Debian 12 carries it for newer hardware); any installed one will do
if ! dpkg-query -W -f='${Package} ${Status}\n' 'linux-image-6.12.*+deb12-amd64' 2>/dev/null | grep -q 'install ok installed'; then
  updated=1
  apt-get update -qq
  k612=$(apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' | awk '{print $1}' | sort -V | tail -1)
  [ -n "$k612" ] || { echo "no linux-image-6.12.*+deb12-amd64 in apt's lists" >&2; exit 1; }
  missing+=("$k612")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo ">> apt-get install ${missing[*]}"
  [ -n "${updated:-}" ] || apt-get update -qq
  # the kernels' postinst builds an initramfs for the host's boot loader; the lab does not use it
  # (virtme-ng builds its own), but the package insists on a generator (initramfs-tools)
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# 5.10 and sid: not in the host's apt sources (about 180 MB and half a minute the first time)
"$(dirname "$0")/fetch-kernel.sh" 5.10 sid
