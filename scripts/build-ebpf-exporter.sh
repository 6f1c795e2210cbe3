#!/usr/bin/env bash
# Builds cloudflare/ebpf_exporter from the Go module proxy against a static libbpf 1.5.
#
#   scripts/build-ebpf-exporter.sh BUILD_DIR            # everything below
#   scripts/build-ebpf-exporter.sh BUILD_DIR headers    # no Go build: libbpf (cargo + make) and the
#                                                       # schema (go mod download): what the BPF
#                                                       # objects and make test-unit's checks need
#
# Why not Debian's libbpf: bookworm ships libbpf 1.1.2, and libbpfgo (used by ebpf_exporter v2.5)
# refers to BPF_MAP_TYPE_ARENA and other 1.4+ symbols, so it does not compile against it.
# libbpf 1.5 source comes from the `libbpf-sys` crate on crates.io (its version 1.5.1+v1.5.1
# vendors libbpf v1.5.1 under libbpf/), fetched with cargo; it builds in seconds with libelf/zlib.
#
# Results, all under BUILD_DIR:
#   bin/ebpf_exporter        the exporter, libbpf linked statically (libelf/libz dynamically)
#   include/bpf/*.h          libbpf's headers (bpf_helpers.h, bpf_tracing.h, bpf_core_read.h ...)
#   lib64/libbpf.a           static libbpf
#   share/ebpf_exporter/config-schema.yaml   upstream's JSON schema for configs (from the module)
#   src/                     scratch: the cargo project that fetched libbpf-sys, libbpf's objects
#
# Idempotent: each part is skipped when present in its version (libbpf: lib64/libbpf.version).
# Go's module and build caches stay where Go puts them by default (GOMODCACHE, GOCACHE).
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ] || { [ $# -eq 2 ] && [ "$2" != headers ]; }; then
  echo "usage: $0 BUILD_DIR [headers]" >&2
  exit 2
fi
MODE=${2:-all}
mkdir -p "$1"
BUILD=$(cd "$1" && pwd)
EBPF_EXPORTER_VERSION=${EBPF_EXPORTER_VERSION:-v2.5.1}
LIBBPF_SYS_VERSION=${LIBBPF_SYS_VERSION:-1.5.1+v1.5.1}
BIN="$BUILD/bin/ebpf_exporter"
SCHEMA="$BUILD/share/ebpf_exporter/config-schema.yaml"
LIBBPF_STAMP="$BUILD/lib64/libbpf.version"

# Go and cargo live outside Debian's PATH on this kind of machine (rustup, go tarball).
export PATH="$PATH:/usr/local/go/bin:${CARGO_HOME:-$HOME/.cargo}/bin"

# `ebpf_exporter --version` prints "ebpf_exporter, version 2.5.1 (branch: ...)": the build below sets
# that string with -ldflags. `go version -m` confirms the module version actually compiled in.
has_version() {
  [ -x "$BIN" ] || return 1
  "$BIN" --version 2>&1 | grep -qF "version ${EBPF_EXPORTER_VERSION#v} " || return 1
  ! command -v go >/dev/null ||
    go version -m "$BIN" | grep -qE "^\s+(mod|dep)\s+github.com/cloudflare/ebpf_exporter/v2\s+$EBPF_EXPORTER_VERSION\s"
}

have_libbpf() {
  [ -f "$BUILD/include/bpf/bpf_helpers.h" ] && [ -f "$BUILD/lib64/libbpf.a" ] &&
    [ "$(cat "$LIBBPF_STAMP" 2>/dev/null)" = "$LIBBPF_SYS_VERSION" ]
}

if have_libbpf && [ -f "$SCHEMA" ] && { [ "$MODE" = headers ] || has_version; }; then
  exit 0
fi

for tool in go cargo make cc pkg-config; do
  command -v "$tool" >/dev/null || { echo "$0: $tool not found (run make deps)" >&2; exit 1; }
done
pkg-config --exists libelf zlib || { echo "$0: libelf-dev and zlib1g-dev are needed" >&2; exit 1; }

start=$(date +%s)

if ! have_libbpf; then
  # --- 1. libbpf source from the libbpf-sys crate -------------------------------------------------
  CRATE_DIR="$BUILD/src/libbpf-sys-fetch"
  mkdir -p "$CRATE_DIR/src"
  # Throwaway project: its only purpose is to let cargo fetch libbpf-sys's source.
  printf '[package]\nname = "libbpf-sys-fetch"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n[dependencies]\nlibbpf-sys = "=%s"\n' \
    "$LIBBPF_SYS_VERSION" >"$CRATE_DIR/Cargo.toml"
  echo "fn main() {}" >"$CRATE_DIR/src/main.rs"
  echo ">> cargo fetch libbpf-sys $LIBBPF_SYS_VERSION"
  # `cargo vendor` copies the crate's unpacked source into a directory of ours (no build scripts run).
  (cd "$CRATE_DIR" && cargo vendor --quiet --versioned-dirs vendor >/dev/null)
  LIBBPF_SRC=$(find "$CRATE_DIR/vendor" -maxdepth 1 -type d -name "libbpf-sys-${LIBBPF_SYS_VERSION%%+*}*" | head -n1)
  if [ -z "$LIBBPF_SRC" ] || [ ! -f "$LIBBPF_SRC/libbpf/src/Makefile" ]; then
    echo "$0: libbpf source not found in the vendored libbpf-sys crate" >&2
    exit 1
  fi

  # --- 2. static libbpf ---------------------------------------------------------------------------
  echo ">> building static libbpf from $LIBBPF_SRC/libbpf"
  OBJ="$BUILD/src/libbpf-obj"
  rm -rf "$OBJ" "$BUILD/include/bpf" "$BUILD/lib64/libbpf.a"
  mkdir -p "$OBJ"
  make -s -C "$LIBBPF_SRC/libbpf/src" -j"$(nproc)" BUILD_STATIC_ONLY=1 OBJDIR="$OBJ" \
    DESTDIR="$BUILD" PREFIX= LIBDIR=/lib64 INCLUDEDIR=/include \
    install install_uapi_headers >/dev/null

  echo "$LIBBPF_SYS_VERSION" >"$LIBBPF_STAMP"
fi

# --- 3. the ebpf_exporter module from the Go module proxy (a download, no build) -----------------
MOD_DIR="$BUILD/src/ebpf-exporter-build"
mkdir -p "$MOD_DIR" "$BUILD/bin"
printf 'module blockstack/ebpf-exporter-build\n\ngo 1.23\n\nrequire github.com/cloudflare/ebpf_exporter/v2 %s\n' \
  "$EBPF_EXPORTER_VERSION" >"$MOD_DIR/go.mod"
rm -f "$MOD_DIR/go.sum"
(cd "$MOD_DIR" && go mod download github.com/cloudflare/ebpf_exporter/v2)
UPSTREAM=$(cd "$MOD_DIR" && go list -m -f '{{.Dir}}' github.com/cloudflare/ebpf_exporter/v2)
# The schema upstream's CI validates example configs against (.vscode/config-schema.yaml).
install -D -m 0644 "$UPSTREAM/.vscode/config-schema.yaml" "$SCHEMA"
[ "$MODE" = headers ] && exit 0
has_version && exit 0

# --- 4. ebpf_exporter built from it ----------------------------------------------------------------
echo ">> go build github.com/cloudflare/ebpf_exporter/v2/cmd/ebpf_exporter@$EBPF_EXPORTER_VERSION"
# `go install MODULE/cmd/ebpf_exporter@VERSION` would be the one-liner, but it asks the proxy for the
# module's version list (to look up deprecations), which this proxy refuses (403), and the checksum
# database has no entry for libbpfgo's pseudo-version. So: a throwaway main module that requires
# exactly ebpf_exporter VERSION (minimal version selection then picks upstream's dependency
# versions), with upstream's own go.sum as the checksums, and `go build` of its command package.
install -m 0644 "$UPSTREAM/go.sum" "$MOD_DIR/go.sum"
# -I include for <bpf/libbpf.h>; libbpf.a needs libelf and zlib. The version ldflag fills
# `--version` (upstream's Makefile sets it the same way, from git).
(cd "$MOD_DIR" && GOFLAGS=-mod=mod CGO_ENABLED=1 \
  CGO_CFLAGS="-I$BUILD/include" \
  CGO_LDFLAGS="$BUILD/lib64/libbpf.a -lelf -lz" \
  go build -ldflags "-X github.com/prometheus/common/version.Version=${EBPF_EXPORTER_VERSION#v}" \
  -o "$BIN.tmp" github.com/cloudflare/ebpf_exporter/v2/cmd/ebpf_exporter)
mv "$BIN.tmp" "$BIN"

has_version || { echo "$0: built $BIN but it does not report $EBPF_EXPORTER_VERSION" >&2; exit 1; }
echo ">> ebpf_exporter $EBPF_EXPORTER_VERSION built in $(($(date +%s) - start)) s: $BIN"
