#!/usr/bin/env bash
# The chart's container image, built here from Debian packages with no registry (`make chart-image`):
#
#   charts/image/build-image.sh OUT_DIR EXPORTERS_DEB VERSION
#
# A Debian 12 root by mmdebstrap (--variant=essential: dpkg, the shell and coreutils, no apt) with
# the blockstack-merges-exporters package (EXPORTERS_DEB, from `make deb`) and its dependencies
# (python3, prometheus-node-exporter...) plus dmsetup (the dm helper's), /usr merged by
# mmdebstrap's merged-usr hook (else apt picks usrmerge, and perl with it: 50 MB), from the host's own
# Debian mirror (blockstack_lab.debian_host.sources); no manuals, translations or docs. Its
# postinst runs as on a host: the service users are made and the units written, never started (no
# systemd in a chroot; the chart runs each program itself). Imported with `podman import` as
#
#   localhost/blockstack-merges-exporters:VERSION
#
# Reproducible: SOURCE_DATE_EPOCH is the last commit's time (as packaging/build-deb.sh's), so
# the same package versions give the same tarball. Cached by its inputs: the package's contents,
# this script and the apt sources (the key); a second run with the same key only checks that
# podman has the image with that key (its label blockstack.image-key). Beside the tarball:
# NAME.packages (package, version, installed size in KiB).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 OUT_DIR EXPORTERS_DEB VERSION" >&2; exit 2; }
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
DEB=$(realpath "$2")
VERSION=$3
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
IMAGE=localhost/blockstack-merges-exporters:$VERSION
PODMAN=(podman --runtime runc --cgroup-manager=cgroupfs)

SOURCES=$("$PY" -c 'from blockstack_lab.debian_host import sources; print("\n".join(sources()))')
# The package by its contents (control and md5sums), not its bytes: `make deb` rewrites it with new
# file times each run, and the image is rebuilt only when something in it changed.
KEY=$({ dpkg-deb --ctrl-tarfile "$DEB" | tar -xO ./control ./md5sums; sha256sum <"$0"; echo "$SOURCES"; } |
      sha256sum | cut -c1-16)
NAME=$OUT/blockstack-merges-exporters-$VERSION-$KEY
if [ "$("${PODMAN[@]}" image inspect --format '{{ index .Labels "blockstack.image-key" }}' "$IMAGE" 2>/dev/null)" = "$KEY" ]; then
  echo ">> $IMAGE is current (key $KEY)"
  exit 0
fi

start=$(date +%s)
if [ ! -s "$NAME.tar" ]; then
  echo ">> mmdebstrap bookworm with $(basename "$DEB") into $NAME.tar"
  SOURCE_DATE_EPOCH=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s)
  export SOURCE_DATE_EPOCH
  printf '%s\n' "$SOURCES" | mmdebstrap --variant=essential --mode=root --format=tar --quiet \
    --include="$DEB" --include=dmsetup \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='chroot "$1" dpkg-query -W -f "\${Package}\t\${Version}\t\${Installed-Size}\n" >"'"$NAME.packages.tmp"'"' \
    --customize-hook='rm -rf "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old "$1"/var/log/*' \
    bookworm "$NAME.tar.tmp" -
  mv "$NAME.packages.tmp" "$NAME.packages"
  mv "$NAME.tar.tmp" "$NAME.tar"
  find "$OUT" -maxdepth 1 -name 'blockstack-merges-exporters-*' ! -name "$(basename "$NAME").*" -delete
fi
echo ">> podman import $IMAGE"
"${PODMAN[@]}" import --quiet --change "LABEL blockstack.image-key=$KEY" \
  --change "LABEL org.opencontainers.image.version=$VERSION" \
  --change "USER 65534:65534" "$NAME.tar" "$IMAGE" >/dev/null
size=$("${PODMAN[@]}" image inspect --format '{{ .Size }}' "$IMAGE")
echo ">> $IMAGE: $((size / 1000000)) MB, $(wc -l <"$NAME.packages") packages ($NAME.packages), built in $(($(date +%s) - start)) s"
