#!/usr/bin/env bash
# Fetches the VM lab's Debian kernels that the host's apt sources do not carry (lab/blockstack_lab/vm.py,
# run by scripts/install-vm.sh): "5.10" (Debian 11 bullseye and bullseye-security) and "sid" (the newest
# kernel of Debian unstable). Usage: fetch-kernel.sh [5.10] [sid] (both by default).
# The host's apt configuration is left alone: a private one in $LAB_APT/NAME (sources.list, lists, an empty
# dpkg status) on the host's own Debian mirror, signatures checked against the host's
# debian-archive-keyring (bookworm's carries the bookworm and trixie archive keys that sign bullseye
# and sid). The packages are unpacked (dpkg-deb -x), not installed: vmlinuz, config and System.map go
# to /boot/*-RELEASE and the modules to /lib/modules/RELEASE, where virtme-ng reads them, then depmod.
# Idempotent: a no-op when the kernel is in /boot and /lib/modules. The release installed is named in
# $LAB_STATE/NAME (vm.py reads sid's there: its release changes with each upload).
set -euo pipefail
# The releases fetched. One that has left the archive (sid moves within weeks; bullseye-security
# keeps only its newest kernel) falls back, with a warning, to the newest of its line: the one
# that suite's linux-image-amd64 depends on.
KERNEL_510=5.10.0-46          # linux-image-5.10.0-46-amd64 5.10.262-1 (bullseye-security)
KERNEL_SID=7.2.13+deb14       # linux-image-7.2.13+deb14-amd64 7.2.13-1: a metapackage of linux-binary-*
                              # (usr/lib/modules/RELEASE/vmlinuz), linux-modules-* (.ko.xz), linux-base-*
LAB_APT=${LAB_APT:-/var/cache/blockstack-lab/apt}
LAB_STATE=${LAB_STATE:-/var/lib/blockstack-lab/kernels}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

say() { echo ">> fetch-kernel: $*"; }
die() { echo "fetch-kernel: $*" >&2; exit 1; }

# The URI of the host's apt source (one-line or deb822 format) that serves suite $1
host_uri() {
  { sed -E 's/#.*//; s/\[[^]]*\]//' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk -v s="$1" '$1 == "deb" && $3 == s {print $2}'
    cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v s="$1" '
      BEGIN { RS = ""; FS = "\n" }
      { types = uris = suites = ""; enabled = 1
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^[ \t]*#/) continue
          if (match($i, /^[A-Za-z-]+:/)) { key = tolower(substr($i, 1, RLENGTH - 1)); val = substr($i, RLENGTH + 1) }
          else val = $i
          if (key == "types") types = types " " val
          else if (key == "uris") uris = uris " " val
          else if (key == "suites") suites = suites " " val
          else if (key == "enabled" && val ~ /[Nn]o/) enabled = 0
        }
        if (enabled && (types " ") ~ /[ \t]deb[ \t]/ && (suites " ") ~ ("[ \t]" s "[ \t]")) { split(uris, u, " "); print u[1] }
      }'
  } | head -1
}

# apt-get / apt-cache with kernel NAME's private configuration ($LAB_APT/NAME); the host's
# apt.conf.d (proxy, Check-Valid-Until) still applies
lab_apt() {
  local tool=$1 d=$LAB_APT/$2; shift 2
  "$tool" -o Dir::Etc::sourcelist="$d/sources.list" -o Dir::Etc::sourceparts="$d/sources.list.d" \
    -o Dir::Etc::preferences="$d/preferences" -o Dir::Etc::preferencesparts="$d/preferences.d" \
    -o Dir::State="$d/state" -o Dir::State::status="$d/status" -o Dir::Cache="$d/cache" \
    -o Acquire::Languages=none -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false "$@"
}

candidate() { { lab_apt apt-cache "$1" show --no-all-versions "$2" 2>/dev/null || true; } | sed -n 's/^Version: //p' | head -1; }

installed() { [ -f "/boot/vmlinuz-$1" ] && [ -f "/lib/modules/$1/modules.dep" ]; }

fetch() {
  local name=$1 pin=$2 suites=$3 release d started pkg version stage modules mod_ext need previous= previous_pin=
  release=$pin-amd64
  [ -f "$LAB_STATE/$name" ] && read -r previous previous_pin < "$LAB_STATE/$name"
  # a no-op when the pinned release, or the fallback taken for this pin, is installed
  if installed "$release"; then
    # the marker too (vm.py reads sid's release there), also when it was lost and the kernel stayed
    [ "$previous" = "$release" ] || { mkdir -p "$LAB_STATE"; echo "$release $pin" > "$LAB_STATE/$name"; }
    return 0
  fi
  if [ "$previous_pin" = "$pin" ] && installed "$previous"; then
    return 0
  fi
  started=$(date +%s)
  d=$LAB_APT/$name
  mkdir -p "$d/sources.list.d" "$d/preferences.d" "$d/state/lists/partial" "$d/cache/archives/partial" "$LAB_STATE"
  : > "$d/status"
  : > "$d/sources.list"
  local main security suite uri
  main=$(host_uri "$HOST_CODENAME"); security=$(host_uri "$HOST_CODENAME-security")
  [ -n "$main" ] || die "no apt source of the host serves $HOST_CODENAME: cannot tell its Debian mirror"
  for suite in $suites; do
    uri=$main
    if [[ $suite == *-security ]]; then
      [ -n "$security" ] || die "no apt source of the host serves $HOST_CODENAME-security: cannot fetch $suite"
      uri=$security
    fi
    echo "deb [arch=amd64 signed-by=$KEYRING] $uri $suite main" >> "$d/sources.list"
  done
  say "$name: apt-get update ($(sed -E 's/^deb \[[^]]*\] //; s/ main$//' "$d/sources.list" | paste -sd, - | sed 's/,/, /g'))"
  lab_apt apt-get "$name" update -qq

  pkg=linux-image-$release
  version=$(candidate "$name" "$pkg")
  if [ -z "$version" ]; then
    pkg=$(lab_apt apt-cache "$name" depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
    [ -n "$pkg" ] || die "$name: neither linux-image-$release nor linux-image-amd64 in $suites"
    release=${pkg#linux-image-}
    version=$(candidate "$name" "$pkg")
    local var=KERNEL_${name^^}
    echo "fetch-kernel: WARNING: $name: linux-image-$pin-amd64 is no longer in $suites; the newest instead:" \
         "$pkg $version (set ${var//./}=${release%-amd64} in $0 to pin it)" >&2
    if installed "$release"; then
      echo "$release $pin" > "$LAB_STATE/$name"
      return 0
    fi
  fi
  # the image package and what it depends on of the same release (sid: linux-binary-, linux-modules-,
  # linux-base-RELEASE; bullseye: none, its linux-image- has all)
  local pkgs=("$pkg=$version") dep
  for dep in $(lab_apt apt-cache "$name" depends "$pkg=$version" | sed -n 's/^ *Depends: //p' | grep -F -- "$release" | sort -u); do
    pkgs+=("$dep=$(candidate "$name" "$dep")")
  done
  stage=$(mktemp -d "$d/stage.XXXXXX")
  trap 'rm -rf "$stage"' EXIT
  chown _apt "$stage" 2>/dev/null || true  # apt-get download fetches as _apt into the current directory
  say "$name: apt-get download ${pkgs[*]}"
  (cd "$stage" && lab_apt apt-get "$name" download -qq "${pkgs[@]}")
  local size
  size=$(cat "$stage"/*.deb | wc -c)
  local deb
  for deb in "$stage"/*.deb; do dpkg-deb -x "$deb" "$stage/root"; done
  # bullseye ships /lib/modules, sid /usr/lib/modules (its vmlinuz, config and System.map there too)
  modules=$stage/root/lib/modules/$release
  [ -d "$modules" ] || modules=$stage/root/usr/lib/modules/$release
  [ -d "$modules" ] || die "$name: no lib/modules/$release in ${pkgs[*]}"
  mod_ext=$(find "$modules" -name '*.ko*' -print -quit | sed -n 's/.*\.ko//p')
  case $mod_ext in
    .xz) need=XZ ;; .zst) need=ZSTD ;; .gz) need=ZLIB ;; *) need= ;;
  esac
  if [ -n "$need" ] && ! kmod --version | grep -q "+$need"; then
    die "$name: its modules are *.ko$mod_ext; this host's kmod lacks $need ($(kmod --version | tail -1))"
  fi
  local f src
  for f in vmlinuz config System.map; do
    src=$stage/root/boot/$f-$release
    [ -f "$src" ] || src=$modules/$f
    [ -f "$src" ] || { [ "$f" != vmlinuz ] && continue; die "$name: no vmlinuz in ${pkgs[*]}"; }
    mv "$src" "$stage/$f"
  done
  # modules first, vmlinuz last: installed() holds only once both are complete
  rm -rf "/lib/modules/$release"
  cp -a "$modules" "/lib/modules/$release"
  depmod -a "$release"
  for f in config System.map; do [ -f "$stage/$f" ] && install -m 0644 "$stage/$f" "/boot/$f-$release"; done
  install -m 0644 "$stage/vmlinuz" "/boot/vmlinuz-$release"
  echo "$release $pin" > "$LAB_STATE/$name"
  # the release this script fetched before for NAME, unless a package owns it
  if [ -n "$previous" ] && [ "$previous" != "$release" ] && [ "$previous" != "$(uname -r)" ] &&
     ! dpkg -S "/boot/vmlinuz-$previous" >/dev/null 2>&1; then
    say "$name: removing $previous (fetched before)"
    rm -rf "/lib/modules/$previous" "/boot/vmlinuz-$previous" "/boot/config-$previous" "/boot/System.map-$previous"
  fi
  rm -rf "$stage"
  trap - EXIT
  say "$name: $release installed: $(( size / 1000000 )) MB downloaded (${#pkgs[@]} package(s), modules *.ko$mod_ext)" \
      "in $(( $(date +%s) - started )) s"
}

HOST_CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$HOST_CODENAME" ] || die "no VERSION_CODENAME in /etc/os-release"
[ $# -gt 0 ] || set -- 5.10 sid
for name in "$@"; do
  case $name in
    5.10) fetch 5.10 "$KERNEL_510" "bullseye bullseye-security" ;;
    sid) fetch sid "$KERNEL_SID" sid ;;
    *) die "unknown kernel $name (5.10 or sid)" ;;
  esac
done
