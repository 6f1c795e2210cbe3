#!/usr/bin/env bash
# Builds the Debian packages of Block Stack Merges from staged trees with dpkg-deb (`make deb`):
#
#   packaging/build-deb.sh OUT_DIR [VERSION [DEB_REVISION]]
#
#   OUT_DIR/blockstack-merges_VERSION-REV_amd64.deb            the single-host stack: exporters,
#       rules, Alertmanager routes, page receiver, dashboard JSON (no Grafana: not in Debian)
#   OUT_DIR/blockstack-merges-exporters_VERSION-REV_amd64.deb  the exporters alone, for a host
#       whose own Prometheus scrapes them
#
# VERSION defaults to the repository's VERSION file (the one place it is kept), DEB_REVISION to 1.
# Needs what `make ebpf-build` makes in BLOCKSTACK_BUILD (default .build): bin/ebpf_exporter and
# ebpf-configs/*.bpf.o. Layout of the installed files (BLOCKSTACK_HOME, paths.py):
#
#   /usr/lib/blockstack-merges/python/      our pure-Python packages (on sys.path through
#                                           /usr/lib/python3/dist-packages/blockstack-merges.pth)
#   /usr/lib/blockstack-merges/alerts/      rules, config.yml, receiver, notification templates
#                                           (alertmanager.yml -> /etc)
#   /usr/lib/blockstack-merges/docs/html/   the runbook as HTML, which Prometheus serves at /user/
#   /usr/lib/blockstack-merges/ebpf-configs/select-configs.sh, build/bin/ebpf_exporter,
#   /usr/lib/blockstack-merges/build/ebpf-configs/   the BPF programs and their configs
#   /usr/share/blockstack-merges/dashboards/block-stack-merges.json (to import into a Grafana)
#   /usr/bin/blockstack-exporter, /usr/bin/blockstack-doctor, /usr/sbin/blockstack-merges-setup
#   /etc/blockstack-merges/                 conffiles
set -euo pipefail
umask 022

REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BLOCKSTACK_BUILD:-$REPO/.build}
OUT=${1:?usage: $0 OUT_DIR [VERSION [DEB_REVISION]]}
VERSION=${2:-$(cat "$REPO/VERSION")}
REVISION=${3:-1}
if ! [[ $VERSION =~ ^[0-9][0-9A-Za-z.+~]*$ ]] || ! [[ $REVISION =~ ^[0-9A-Za-z.+~]+$ ]]; then
  echo "bad version $VERSION-$REVISION (Debian policy 5.6.12)" >&2
  exit 2
fi
DEBVERSION=$VERSION-$REVISION
EBPF_EXPORTER=$BUILD/bin/ebpf_exporter
for f in "$EBPF_EXPORTER" "$BUILD"/ebpf-configs/block_io.bpf.o; do
  [ -e "$f" ] || { echo "$f missing: run make ebpf-build" >&2; exit 2; }
done
HOME_DIR=usr/lib/blockstack-merges
# The changelog's date: the last commit's (reproducible), else now
DATE=$(date -R -d "@$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s)")
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STAGE=$OUT/stage
rm -rf "$STAGE"

# The service users and groups purge deletes: privileges.IDENTITIES (each user has its own group)
# and privileges.GROUP.
read -r SVC_USERS SVC_GROUPS < <(cd "$REPO/deploy" && python3 -B -c '
from blockstack_deploy import privileges as p
users = sorted({u for u, _, _ in p.IDENTITIES.values()})
print(",".join(users), ",".join(users + [p.GROUP]))')
SVC_USERS=${SVC_USERS//,/ }
SVC_GROUPS=${SVC_GROUPS//,/ }

py_tree() {  # py_tree SRC_DIR DEST_DIR: the .py files (and package data) of a package, no caches or tests
  (cd "$1" && find . -name __pycache__ -prune -o -name tests -prune -o \( -name '*.py' -print \)) |
    while read -r f; do install -D -m 644 "$1/$f" "$2/$f"; done
}

stage_common() {  # the exporters, their Python, ebpf_exporter, the setup program, the conffile
  local root=$1
  local lib=$root/$HOME_DIR
  py_tree "$REPO/httpd" "$lib/python"
  rm -f "$lib/python/setup.py"
  py_tree "$REPO/exporters/blockstack_exporter" "$lib/python/blockstack_exporter"
  install -m 644 "$REPO/alerts/config.yml" "$lib/python/blockstack_exporter/config.yml"  # the link's target
  py_tree "$REPO/deploy/blockstack_deploy" "$lib/python/blockstack_deploy"
  py_tree "$REPO/alerts/blockstack_rules" "$lib/python/blockstack_rules"
  install -D -m 644 "$REPO/alerts/config.yml" "$lib/alerts/config.yml"
  install -D -m 755 "$REPO/ebpf-configs/select-configs.sh" "$lib/ebpf-configs/select-configs.sh"
  install -d "$lib/build/bin" "$lib/build/ebpf-configs"
  # Go's debug information off (lintian: unstripped-binary-or-object); the build's copy is kept
  strip --strip-unneeded --remove-section=.comment --remove-section=.note -o "$lib/build/bin/ebpf_exporter" "$EBPF_EXPORTER"
  chmod 755 "$lib/build/bin/ebpf_exporter"
  for o in "$BUILD"/ebpf-configs/*.bpf.o; do
    # DWARF off; .BTF and .BTF.ext stay (CO-RE relocations and the maps' types need them)
    llvm-strip --strip-debug -o "$lib/build/ebpf-configs/$(basename "$o")" "$o" 2>/dev/null ||
      install -m 644 "$o" "$lib/build/ebpf-configs/"
    chmod 644 "$lib/build/ebpf-configs/$(basename "$o")"
  done
  install -m 644 "$BUILD"/ebpf-configs/*.yaml "$lib/build/ebpf-configs/"
  install -D -m 644 /dev/stdin "$root/usr/lib/python3/dist-packages/blockstack-merges.pth" <<<"/$HOME_DIR/python"
  for prog in exporter:main doctor:doctor; do
    install -D -m 755 /dev/stdin "$root/usr/bin/blockstack-${prog%%:*}" <<EOF
#!/usr/bin/python3
# blockstack-${prog%%:*} of the Debian package (packaging/build-deb.sh): blockstack_exporter.${prog#*:}
# from /$HOME_DIR/python (blockstack-merges.pth)
import sys

sys.dont_write_bytecode = True  # run as root too: nothing written under /usr/lib
from blockstack_exporter.${prog#*:} import main  # noqa: E402

sys.exit(main())
EOF
  done
  install -D -m 755 "$REPO/packaging/blockstack-merges-setup" "$root/usr/sbin/blockstack-merges-setup"
  install -D -m 644 "$REPO/packaging/debian/blockstack-merges.conf" "$root/etc/blockstack-merges/blockstack-merges.conf"
}

stage_full() {  # what a host running the whole stack adds: rules, routes, receiver, dashboard
  local root=$1
  local lib=$root/$HOME_DIR
  for f in alerts.rules.yml recording.rules.yml fleet.rules.yml; do
    install -m 644 "$REPO/alerts/$f" "$lib/alerts/$f"
  done
  install -D -m 644 "$REPO/alerts/alertmanager.yml" "$root/etc/blockstack-merges/alertmanager.yml"
  ln -s /etc/blockstack-merges/alertmanager.yml "$lib/alerts/alertmanager.yml"
  install -D -m 644 "$REPO/alerts/receiver/page_receiver.py" "$lib/alerts/receiver/page_receiver.py"
  install -D -m 644 "$REPO/alerts/receiver/dead_mans_switch.py" "$lib/alerts/receiver/dead_mans_switch.py"
  # the text of e-mail and chat notifications (alertmanager.yml `templates:`, relative to alerts/)
  install -D -m 644 "$REPO/alerts/templates/blockstack.tmpl" "$lib/alerts/templates/blockstack.tmpl"
  # the runbook and the other documents a page links to, served by Prometheus at /user/ (stack.DOCS_HTML)
  install -d "$lib/docs/html"
  install -m 644 "$REPO"/docs/html/*.html "$lib/docs/html/"
  install -D -m 644 "$REPO/dashboards/block-stack-merges.json" \
    "$root/usr/share/blockstack-merges/dashboards/block-stack-merges.json"
  ln -s ../../share/blockstack-merges/dashboards "$lib/dashboards"
}

build() {  # build PACKAGE SUMMARY DEPENDS RECOMMENDS CONFLICTS DESCRIPTION CONTENTS
  local pkg=$1 summary=$2 depends=$3 recommends=$4 conflicts=$5 description=$6 contents=$7
  local root=$STAGE/$pkg
  stage_common "$root"
  [ "$pkg" = blockstack-merges ] && stage_full "$root"
  local doc=$root/usr/share/doc/$pkg
  install -D -m 644 "$REPO/packaging/debian/copyright" "$doc/copyright"
  sed -e "s/@PACKAGE@/$pkg/g" -e "s/@DEBVERSION@/$DEBVERSION/g" -e "s/@VERSION@/$VERSION/g" \
      -e "s/@DATE@/$DATE/g" -e "s|@CONTENTS@|${contents//$'\n'/\\n}|g" "$REPO/packaging/debian/changelog.in" |
    gzip -9n >"$doc/changelog.Debian.gz"
  chmod 644 "$doc/changelog.Debian.gz"
  install -D -m 644 "$REPO/packaging/debian/$pkg.lintian-overrides" "$root/usr/share/lintian/overrides/$pkg"
  install -d -m 755 "$root/DEBIAN"
  for script in postinst prerm postrm; do
    sed -e "s/@PACKAGE@/$pkg/g" -e "s/@USERS@/$SVC_USERS/g" -e "s/@GROUPS@/$SVC_GROUPS/g" \
      "$REPO/packaging/debian/$script" >"$root/DEBIAN/$script"
    chmod 755 "$root/DEBIAN/$script"
  done
  (cd "$root" && find etc -type f -printf '/%p\n' | sort) >"$root/DEBIAN/conffiles"
  # Shared libraries of ebpf_exporter (libc6, libelf1, zlib1g) as dpkg-shlibdeps finds them
  local shlibs
  shlibs=$(cd "$root" && mkdir -p debian && printf 'Source: blockstack-merges\n\nPackage: %s\nArchitecture: amd64\n' "$pkg" >debian/control &&
           dpkg-shlibdeps -O "$HOME_DIR/build/bin/ebpf_exporter" 2> >(grep -v "should already be installed" >&2) | sed -n 's/^shlibs:Depends=//p'; rm -rf debian)
  [ -n "$shlibs" ] || { echo "dpkg-shlibdeps found no shared libraries of ebpf_exporter" >&2; exit 1; }
  (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
  chmod 644 "$root/DEBIAN/md5sums" "$root/DEBIAN/conffiles"
  local size
  size=$(du -k -s --exclude=DEBIAN "$root" | cut -f1)
  sed -e "s/@PACKAGE@/$pkg/g" -e "s/@DEBVERSION@/$DEBVERSION/g" -e "s/@SIZE@/$size/g" \
      -e "s/@DEPENDS@/$depends, $shlibs/g" -e "s/@RECOMMENDS@/$recommends/g" -e "s/@CONFLICTS@/$conflicts/g" \
      -e "s/@SUMMARY@/$summary/g" "$REPO/packaging/debian/control.in" |
    awk -v d="$description" '$0 == "@DESCRIPTION@" { print d; next } { print }' >"$root/DEBIAN/control"
  chmod 644 "$root/DEBIAN/control"
  local deb=$OUT/${pkg}_${DEBVERSION}_amd64.deb
  dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
  echo ">> $deb"
}

PYDEPS="python3 (>= 3.9), python3-prometheus-client (>= 0.16), python3-yaml (>= 6.0)"
NODE="prometheus-node-exporter (>= 1.5)"

build blockstack-merges \
  "Linux block-layer merge monitoring: exporters, rules, alerting" \
  "$PYDEPS, python3-bcrypt, $NODE, passwd, openssl" \
  "prometheus (>= 2.42), prometheus-alertmanager (>= 0.25), dmsetup" \
  "blockstack-merges-exporters" \
  " Block Stack Merges catches Linux block-layer regressions (merges that
 collapse, snapshots that split I/O, journals that starve) on this host:
 node_exporter's diskstats for every layer, blockstack-exporter (queue
 settings, device stacks, dm snapshots, ext4, jbd2) and blockstack-doctor,
 ebpf_exporter with BPF programs chosen for the running kernel, and Debian's
 Prometheus and Alertmanager with the project's rules, routes and page
 receiver, each a systemd unit under its own system user with the least
 privilege it needs.
 .
 Grafana is not in Debian: the dashboard JSON is shipped for import." \
  "exporters, ebpf_exporter v2.5.1 and its BPF programs, rules,
    Alertmanager routes, page receiver and the dashboard JSON."

build blockstack-merges-exporters \
  "Linux block-layer merge exporters for an existing Prometheus" \
  "$PYDEPS, $NODE, passwd" \
  "dmsetup" \
  "blockstack-merges" \
  " The exporters of Block Stack Merges alone, for a host whose own
 Prometheus scrapes them: node_exporter's diskstats for every layer (loop
 and dm devices kept), blockstack-exporter (queue settings, device stacks,
 dm snapshots, ext4, jbd2) with blockstack-doctor, and ebpf_exporter with
 BPF programs chosen for the running kernel, each a systemd unit under its
 own system user with the least privilege it needs." \
  "exporters, blockstack-doctor, ebpf_exporter v2.5.1 and its BPF
    programs."
rm -rf "$STAGE"
