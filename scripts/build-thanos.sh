#!/usr/bin/env bash
# Builds Thanos (cmd/thanos) from the Go module proxy.
#
#   scripts/build-thanos.sh BUILD_DIR
#
# Why not `go install github.com/thanos-io/thanos/cmd/thanos@v0.42.5`: Thanos's go.mod carries
# `replace` directives (forks of prometheus, etc.), and `go install MOD@VERSION` refuses any module
# whose go.mod has replace or exclude directives. So, as for ebpf_exporter: a throwaway main module
# that requires exactly THANOS_VERSION and repeats upstream's replace directives (copied from the
# module's own go.mod, fetched from the proxy), with upstream's go.sum, and `go build` of cmd/thanos.
# Thanos v0.42 needs Go >= 1.26.10; the proxy serves that toolchain, selected with GOTOOLCHAIN.
#
# Results, all under BUILD_DIR:
#   bin/thanos               the Thanos binary (one binary: query, sidecar, store, receive, ...)
#   src/thanos-build/        scratch: the wrapper module
#
# Idempotent: exits at once when bin/thanos exists and reports THANOS_VERSION.
# Go's module and build caches stay where Go puts them by default (GOMODCACHE, GOCACHE).
# First build: about 3-4 minutes on 2 cores; cached after.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
mkdir -p "$1"
BUILD=$(cd "$1" && pwd)
THANOS_VERSION=${THANOS_VERSION:-v0.42.5}
THANOS_GO_TOOLCHAIN=${THANOS_GO_TOOLCHAIN:-go1.26.10}
BIN="$BUILD/bin/thanos"
MOD=github.com/thanos-io/thanos
# Upstream's release build tags (.promu.yml `build.tags.all`). slicelabels is not optional:
# Thanos's labelpb casts Prometheus's labels.Labels to its protobuf labels in place, which is only
# valid for the slice implementation; without the tag the sidecar panics on its first gRPC answer
# ("index out of range [64]" in grpc's buffer pool: a garbage message size).
THANOS_BUILD_TAGS=netgo,slicelabels

export PATH="$PATH:/usr/local/go/bin"

# `thanos --version` prints "thanos, version 0.42.5 (branch: ...)": set below with -ldflags.
# `go version -m` confirms the module version actually compiled in.
has_version() {
  [ -x "$BIN" ] || return 1
  "$BIN" --version 2>&1 | grep -qF "version ${THANOS_VERSION#v} " || return 1
  ! command -v go >/dev/null ||
    { GOTOOLCHAIN=local go version -m "$BIN" | grep -qE "^\s+(mod|dep)\s+$MOD\s+$THANOS_VERSION(\s|$)" &&
      GOTOOLCHAIN=local go version -m "$BIN" | grep -qE "^\s+build\s+-tags=$THANOS_BUILD_TAGS$"; }
}

if has_version; then
  exit 0
fi

command -v go >/dev/null || { echo "$0: go not found (install Go >= 1.21 at /usr/local/go)" >&2; exit 1; }
export GOTOOLCHAIN="$THANOS_GO_TOOLCHAIN"
start=$(date +%s)

MOD_DIR="$BUILD/src/thanos-build"
mkdir -p "$MOD_DIR" "$BUILD/bin"
echo ">> fetching $MOD@$THANOS_VERSION go.mod from the module proxy"
# `go mod download -json` prints the path of the cached go.mod (GoMod) and source (Dir).
printf 'module blockstack/thanos-build\n\ngo 1.26\n' >"$MOD_DIR/go.mod"
rm -f "$MOD_DIR/go.sum"
INFO=$(cd "$MOD_DIR" && go mod download -json "$MOD@$THANOS_VERSION")
UP_GOMOD=$(printf '%s' "$INFO" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
UP_DIR=$(printf '%s' "$INFO" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
[ -f "$UP_GOMOD" ] && [ -d "$UP_DIR" ] || { echo "$0: could not download $MOD@$THANOS_VERSION" >&2; exit 1; }
UP_GO=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$UP_GOMOD" | head -n1)

# The wrapper: upstream's `go` line, the one requirement, and every replace directive verbatim
# (both the single-line `replace a => b v` and the `replace ( ... )` block forms).
{
  printf 'module blockstack/thanos-build\n\ngo %s\n\nrequire %s %s\n\n' "$UP_GO" "$MOD" "$THANOS_VERSION"
  awk '
    /^replace[ \t]*\($/ { inblock = 1; print; next }
    inblock { print; if ($0 ~ /^\)/) { inblock = 0; print "" }; next }
    /^replace[ \t]/ { print }
  ' "$UP_GOMOD"
} >"$MOD_DIR/go.mod"
install -m 0644 "$UP_DIR/go.sum" "$MOD_DIR/go.sum"
printf '// Package main pins Thanos as a dependency so `go build` resolves it with upstream'"'"'s replaces.\npackage main\n\nimport _ "%s/pkg/component"\n\nfunc main() {}\n' "$MOD" >"$MOD_DIR/tools.go"
echo ">> go build $MOD/cmd/thanos@$THANOS_VERSION with $GOTOOLCHAIN"
V=github.com/prometheus/common/version
(cd "$MOD_DIR" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -tags "$THANOS_BUILD_TAGS" \
  -ldflags "-s -w -X $V.Version=${THANOS_VERSION#v} -X $V.Branch=HEAD -X $V.BuildUser=blockstack-merges" \
  -o "$BIN.tmp" "$MOD/cmd/thanos")
mv "$BIN.tmp" "$BIN"
has_version || { echo "$0: built $BIN but it does not report $THANOS_VERSION" >&2; exit 1; }
echo ">> thanos $THANOS_VERSION built in $(($(date +%s) - start)) s: $BIN"
