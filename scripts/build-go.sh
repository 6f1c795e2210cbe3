#!/usr/bin/env bash
# Builds Go binaries of one module version from the Go module proxy (Thanos, Prometheus 3,
# Alertmanager; ebpf_exporter has its own script because it links a static libbpf with cgo).
#
#   scripts/build-go.sh BUILD_DIR MODULE@VERSION [--tags T,...] [--version V] NAME=PACKAGE...
#
#   scripts/build-go.sh .build github.com/thanos-io/thanos@v0.42.5 --tags netgo,slicelabels thanos=cmd/thanos
#   scripts/build-go.sh .build github.com/prometheus/prometheus@v0.316.0 --version 3.16.0 \
#     --tags netgo,remove_all_sd prometheus-3.16.0=cmd/prometheus promtool-3.16.0=cmd/promtool
#
# Why not `go install MODULE/cmd/x@VERSION`: it refuses modules whose go.mod has replace or
# exclude directives (Thanos has forks of prometheus etc.), and this proxy refuses the version
# list some `go install` paths ask for. So: a throwaway main module that requires exactly
# MODULE@VERSION and repeats upstream's replace directives (copied from the module's own go.mod,
# fetched from the proxy), with upstream's go.sum, and `go build` of each PACKAGE (relative to
# MODULE) into BUILD_DIR/bin/NAME.
#
#   --tags     build tags (upstream's release tags from .promu.yml, adapted; see the Makefile)
#   --version  what `NAME --version` reports (prometheus/common/version.Version, which every
#              binary here uses); default VERSION without the v. Prometheus 3.X.Y is module
#              version v0.3XX.Y, hence --version for it. `--version -`: the binary has no
#              --version flag (dashboard-linter); only `go version -m` is checked.
#   --sum Z,M  the module's own checksums (h1: of its zip, h1: of its go.mod), pinned here for a
#              version the checksum database does not list (a pseudo-version of dashboard-linter):
#              written into the wrapper's go.sum, so Go verifies the download against them
#   NAME=.     the module's root package (dashboard-linter's main is at its root)
#
# Results, all under BUILD_DIR: bin/NAME for each NAME=PACKAGE; src/BASENAME-build/ (scratch: the
# wrapper module); .go-compile.lock (one compile at a time, below). Idempotent: a NAME is skipped when bin/NAME reports --version and `go version -m`
# shows MODULE@VERSION built with these tags; the script exits at once when all are.
# Go's module and build caches stay where Go puts them by default (GOMODCACHE, GOCACHE). The
# toolchain is GO_TOOLCHAIN (default go1.26.10, the one Thanos v0.42 needs; the proxy serves it).
set -euo pipefail

usage() { echo "usage: $0 BUILD_DIR MODULE@VERSION [--tags T] [--version V] NAME=PACKAGE..." >&2; exit 2; }
[ $# -ge 3 ] || usage
mkdir -p "$1"
BUILD=$(cd "$1" && pwd)
MOD=${2%@*}
MOD_VERSION=${2##*@}
[ "$MOD" != "$2" ] || usage
shift 2
TAGS=netgo
SUM=
VERSION=${MOD_VERSION#v}
while [ $# -gt 0 ]; do
  case $1 in
    --tags) TAGS=$2; shift 2 ;;
    --version) VERSION=$2; shift 2 ;;
    --sum) SUM=$2; shift 2 ;;
    *=*) break ;;
    *) usage ;;
  esac
done
[ $# -ge 1 ] || usage
GO_TOOLCHAIN=${GO_TOOLCHAIN:-go1.26.10}
export PATH="$PATH:/usr/local/go/bin"

# `NAME --version` prints "NAME, version 3.16.0 (branch: ...)": set below with -ldflags.
# `go version -m` confirms the module version and tags actually compiled in.
has_version() {
  local bin=$1
  [ -x "$bin" ] || return 1
  [ "$VERSION" = - ] || "$bin" --version 2>&1 | grep -qF "version $VERSION " || return 1
  ! command -v go >/dev/null ||
    { GOTOOLCHAIN=local go version -m "$bin" | grep -qE "^\s+(mod|dep)\s+$MOD\s+$MOD_VERSION(\s|$)" &&
      GOTOOLCHAIN=local go version -m "$bin" | grep -qE "^\s+build\s+-tags=$TAGS$"; }
}

todo=()
for spec in "$@"; do
  has_version "$BUILD/bin/${spec%%=*}" || todo+=("$spec")
done
[ ${#todo[@]} -gt 0 ] || exit 0

command -v go >/dev/null || { echo "$0: go not found (install Go >= 1.21 at /usr/local/go)" >&2; exit 1; }
export GOTOOLCHAIN="$GO_TOOLCHAIN"
start=$(date +%s)

NAME=$(basename "$MOD")
MOD_DIR="$BUILD/src/$NAME-build"
mkdir -p "$MOD_DIR" "$BUILD/bin"
echo ">> fetching $MOD@$MOD_VERSION from the module proxy"
# `go mod download -json` prints the path of the cached go.mod (GoMod) and source (Dir).
printf 'module blockstack/%s-build\n\ngo 1.21\n' "$NAME" >"$MOD_DIR/go.mod"
rm -f "$MOD_DIR/go.sum"
[ -z "$SUM" ] || printf '%s %s %s\n%s %s/go.mod %s\n' "$MOD" "$MOD_VERSION" "${SUM%,*}" "$MOD" "$MOD_VERSION" "${SUM#*,}" >"$MOD_DIR/go.sum"
INFO=$(cd "$MOD_DIR" && go mod download -json "$MOD@$MOD_VERSION")
UP_GOMOD=$(printf '%s' "$INFO" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
UP_DIR=$(printf '%s' "$INFO" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
[ -f "$UP_GOMOD" ] && [ -d "$UP_DIR" ] || { echo "$0: could not download $MOD@$MOD_VERSION" >&2; exit 1; }
UP_GO=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$UP_GOMOD" | head -n1)

# The wrapper: upstream's `go` line, the one requirement, and every replace directive verbatim
# (both the single-line `replace a => b v` and the `replace ( ... )` block forms).
{
  printf 'module blockstack/%s-build\n\ngo %s\n\nrequire %s %s\n\n' "$NAME" "$UP_GO" "$MOD" "$MOD_VERSION"
  awk '
    /^replace[ \t]*\($/ { inblock = 1; print; next }
    inblock { print; if ($0 ~ /^\)/) { inblock = 0; print "" }; next }
    /^replace[ \t]/ { print }
  ' "$UP_GOMOD"
} >"$MOD_DIR/go.mod"
install -m 0644 "$UP_DIR/go.sum" "$MOD_DIR/go.sum"
[ -z "$SUM" ] || printf '%s %s %s\n%s %s/go.mod %s\n' "$MOD" "$MOD_VERSION" "${SUM%,*}" "$MOD" "$MOD_VERSION" "${SUM#*,}" >>"$MOD_DIR/go.sum"

# Every module the packages need, downloaded before the lock below (network, not CPU).
pkgs=()
for spec in "${todo[@]}"; do
  if [ "${spec#*=}" = . ]; then pkgs+=("$MOD"); else pkgs+=("$MOD/${spec#*=}"); fi
done
(cd "$MOD_DIR" && GOFLAGS=-mod=mod CGO_ENABLED=0 go list -tags "$TAGS" -deps "${pkgs[@]}" >/dev/null)

# One Go compile at a time (make -j runs several of these scripts at once): `go build` keeps both
# cores busy on a large module by itself, and two builds at once compile the dependencies they
# share twice, where one after the other the second finds them in GOCACHE. Downloads, apt, pip,
# the kernels and the images go on beside it. (ebpf_exporter's build takes no part: it is the
# VM tier's input, first in line.)
# At a low priority (GO_BUILD_NICE, default 10): make test runs these beside the VM tier and the
# tests (scripts/run-tests.sh), whose timing counts, and beside ebpf_exporter's build, which both
# wait for; the compile takes what they leave.
NICE=${GO_BUILD_NICE:-10}
exec 9>"$BUILD/.go-compile.lock"
waited=$(date +%s)
flock 9
[ $(($(date +%s) - waited)) -lt 2 ] || echo ">> $MOD: waited $(($(date +%s) - waited)) s for another Go build"

V=github.com/prometheus/common/version
for spec in "${todo[@]}"; do
  out=${spec%%=*}
  pkg=$MOD/${spec#*=}
  [ "${spec#*=}" != . ] || pkg=$MOD
  bin="$BUILD/bin/$out"
  echo ">> go build $pkg@$MOD_VERSION (tags $TAGS) with $GOTOOLCHAIN -> bin/$out"
  (cd "$MOD_DIR" && GOFLAGS=-mod=mod CGO_ENABLED=0 nice -n "$NICE" go build -trimpath -tags "$TAGS" \
    -ldflags "-s -w -X $V.Version=$VERSION -X $V.Branch=HEAD -X $V.BuildUser=blockstack-merges" \
    -o "$bin.tmp" "$pkg")
  mv "$bin.tmp" "$bin"
  has_version "$bin" || { echo "$0: built $bin but it does not report $VERSION / $MOD@$MOD_VERSION" >&2; exit 1; }
done
echo ">> $MOD@$MOD_VERSION: ${todo[*]%%=*} built in $(($(date +%s) - start)) s"
