# Block Stack Merges — one Makefile for the whole stack.
# `make up` runs the stack on this host; `make test` runs every test; `make help` lists the targets.

SHELL        := /bin/bash
PYTHON       ?= python3
VENV         := .venv
VPY          := $(VENV)/bin/python
PYTEST       := $(VENV)/bin/pytest
BUILD        := .build
EBPF_EXPORTER_VERSION := v2.5.1
LIBBPF_SYS_VERSION    := 1.5.1+v1.5.1
EBPF_EXPORTER := $(BUILD)/bin/ebpf_exporter
LIBBPF_HEADERS := $(BUILD)/include/bpf/bpf_helpers.h
EBPF_SCHEMA    := $(BUILD)/share/ebpf_exporter/config-schema.yaml

# Every target with a `## target:` line (what make help lists) is a command, not a file.
.PHONY: all $(shell sed -n 's/^## \([a-z0-9-]*\):.*/\1/p' $(firstword $(MAKEFILE_LIST)))

all: venv

## help: this list: each target's `## target: what` line in this Makefile
help:
	@awk '/^## [a-z0-9-]+:/ { sub(/^## /, ""); i = index($$0, ":"); \
	        printf "  %-20s %s\n", substr($$0, 1, i - 1), substr($$0, i + 2); next } \
	      /^##   / { printf "  %-20s %s\n", "", substr($$0, 6) }' $(MAKEFILE_LIST)

## deps: Debian packages every part needs (idempotent, fast when present)
deps:
	@echo ">> installing Debian packages"
	@scripts/install-deps.sh

## venv: Python virtual environment with the exporter, the stack model (deploy/), the rules and dashboard generators, the lab kit, the test support (testsupport/) and test tools
venv: $(VENV)/.stamp
PACKAGES := httpd exporters deploy testsupport lab alerts alerts/receiver dashboards
# Third-party packages only from requirements.txt, each checked against its sha256 (--require-hashes,
# wheels only: no build step fetches anything unchecked); then the project's own packages, editable,
# with no dependency resolution and the locked setuptools (their dependencies are in the lock:
# pip check fails otherwise).
$(VENV)/.stamp: $(addsuffix /pyproject.toml,$(PACKAGES)) requirements.txt
	@echo ">> creating $(VENV)"
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@$(VPY) -m pip install -q --require-hashes --only-binary=:all: -r requirements.txt
	@$(VPY) -m pip install -q --no-deps --no-build-isolation $(addprefix -e ,$(PACKAGES))
	@$(VPY) -m pip check
	@touch $@

## lock: recompile requirements.txt from requirements.in with pip-tools (every transitive dependency, sha256 hashes; LOCK_ARGS=--upgrade to move pins)
PIP_TOOLS_VERSION := 7.6.2
lock:
	@test -x $(BUILD)/pip-tools/bin/pip-compile || \
		{ $(PYTHON) -m venv $(BUILD)/pip-tools && $(BUILD)/pip-tools/bin/pip install -q pip-tools==$(PIP_TOOLS_VERSION); }
	@$(BUILD)/pip-tools/bin/pip-compile -q --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
		--no-emit-find-links $(LOCK_ARGS) --output-file=requirements.txt requirements.in

## ebpf-exporter: build cloudflare ebpf_exporter from the Go module proxy against a static libbpf 1.5 (cached)
ebpf-exporter: $(EBPF_EXPORTER)
# libbpf and the schema first (the headers' target): both runs of the script share its scratch tree
$(EBPF_EXPORTER): scripts/build-ebpf-exporter.sh $(LIBBPF_HEADERS) | deps
	@echo ">> building ebpf_exporter $(EBPF_EXPORTER_VERSION)"
	@EBPF_EXPORTER_VERSION=$(EBPF_EXPORTER_VERSION) LIBBPF_SYS_VERSION=$(LIBBPF_SYS_VERSION) \
		scripts/build-ebpf-exporter.sh $(BUILD)
	@touch $@  # the script may find it already built; make must see it fresh

## ebpf-headers: libbpf's headers and upstream's config schema, no Go build (cached)
ebpf-headers: $(LIBBPF_HEADERS) $(EBPF_SCHEMA)
$(LIBBPF_HEADERS) $(EBPF_SCHEMA) &: scripts/build-ebpf-exporter.sh | deps
	@EBPF_EXPORTER_VERSION=$(EBPF_EXPORTER_VERSION) LIBBPF_SYS_VERSION=$(LIBBPF_SYS_VERSION) \
		scripts/build-ebpf-exporter.sh $(BUILD) headers
	@touch $@

## ebpf-objects: compile every BPF program against this kernel's BTF (what the static checks read)
ebpf-objects: ebpf-headers
	@echo ">> compiling BPF programs"
	@$(MAKE) -s -C ebpf-configs BUILD=$(abspath $(BUILD))

## ebpf-build: the BPF programs and ebpf_exporter to load them
ebpf-build: $(EBPF_EXPORTER) ebpf-objects

## deb: the Debian packages into .build/deb: blockstack-merges and blockstack-merges-exporters (VERSION=, DEB_REVISION= to override)
# The version is kept in one place, the VERSION file; `make deb VERSION=0.0.9` builds another one
# (an upgrade test's previous build). packaging/build-deb.sh stages each tree and runs dpkg-deb.
VERSION      := $(shell cat VERSION)
DEB_REVISION := 1
deb: deps ebpf-build
	@echo ">> building the Debian packages $(VERSION)-$(DEB_REVISION)"
	@packaging/build-deb.sh $(BUILD)/deb $(VERSION) $(DEB_REVISION)

## grafana: the Grafana server (GRAFANA_HOME, grafana on PATH, or ../shared/grafana's tarball unpacked once into .build/)
grafana: venv
	@$(VPY) -m blockstack_deploy.grafana

## test: every test (unit, golden, live on loop devices, real servers, the linters, the VM tier beside the rest)
# scripts/run-tests.sh builds test-inputs and test-vm-start in one `make -j` (what waits on the
# network beside what compiles), then runs the tests.
test:
	@PYTEST=$(PYTEST) MAKE=$(MAKE) scripts/run-tests.sh

# What make test runs, and which of its tests needs each:
#   deps vm-deps venv   every test; vm-deps: the VM tier (QEMU, the kernels, the Debian host's image)
#   ebpf-build          the BPF tests, the stack's tests, the VM tier (ebpf_exporter, the objects)
#   grafana             dashboards/tests/test_grafana*.py, the 24 h peaks
#   linters             the `linters` tests (pint, dashboard-linter, go-jsonnet's mixin checks)
#   helm k8s-schemas chart   charts/tests/test_chart.py (helm lint, kubeconform)
#   chart-image         charts/tests/test_podman.py (the chart's pod under podman)
## test-inputs: build everything make test needs, nothing run (make -j test-inputs overlaps the builds)
test-inputs: deps vm-deps venv ebpf-build grafana linters helm k8s-schemas chart chart-image

## test-long: the tier make test leaves out for its 25 min (pytest -m long: Prometheus 3, Alertmanager 0.31 and Thanos built from the Go module proxy, the fleet roles, sid's NVMe incident; root, ~35 min on a fresh machine); run it before an issue is resolved
test-long: deps vm-deps venv ebpf-build grafana thanos upstream-servers linters helm k8s-schemas chart chart-image
	@echo ">> the long tier: its tests but the VM's, then the VM's"
	@$(PYTEST) -m "long and not vm and not vm_long" -n 2 --dist loadfile --durations=15
	@$(PYTEST) -m "long and vm and not vm_long" --durations=5

## test-early: the inputs of make test's early tests, all but those marked built or linters (scripts/run-tests.sh starts them once these are done)
test-early: deps venv ebpf-build grafana
	@scripts/run-tests.sh --early-ready

## test-vm-start: the VM tier of make test in the background, its output in .build/test-vm/log (scripts/run-tests.sh)
test-vm-start: deps vm-deps venv ebpf-build
	@PYTEST=$(PYTEST) scripts/run-tests.sh --start-vm

## test-unit: the fast tier: every static check and unit test; no root, no servers, no Go build, under a minute
UNIT := not root and not servers and not built and not linters and not vm
test-unit: deps venv ebpf-objects
	@echo ">> running unit tests"
	@$(PYTEST) -n 2 --dist loadfile -m "$(UNIT)"

## format: rewrite every Python file as ruff formats it and apply ruff's safe fixes (tests/test_lint.py checks both)
format: venv
	@$(VENV)/bin/ruff format .
	@$(VENV)/bin/ruff check --fix .

## linters: cloudflare/pint (rules), grafana/dashboard-linter (dashboard) and go-jsonnet (the mixin) from the Go module proxy into .build/bin (cached)
# dashboard-linter: its releases (v0.3.0) need a grafana/apps/dashboard pseudo-version the proxy
# refuses, so the last commit before them that builds (2024-12-24); the checksum database does not
# list that pseudo-version, so its checksums are pinned here (--sum) and Go verifies against them.
PINT_VERSION             := v0.87.0
DASHBOARD_LINTER_VERSION := v0.0.0-20241224134444-1765d94aec4a
DASHBOARD_LINTER_SUM     := h1:wpyAYX8+Rqu0LIEE7zXBR/qjBH4t0yXvqlRGa1wD5rg=,h1:aeONzEz1tWGxQvxYm5DFxxaJ90JINhRT50TrZ0oXuJM=
PINT                     := $(BUILD)/bin/pint
DASHBOARD_LINTER         := $(BUILD)/bin/dashboard-linter
JSONNET_VERSION          := v0.22.0
JSONNET                  := $(BUILD)/bin/jsonnet
JSONNETFMT               := $(BUILD)/bin/jsonnetfmt
JSONNET_LINT             := $(BUILD)/bin/jsonnet-lint
linters: $(PINT) $(DASHBOARD_LINTER) $(JSONNET)
$(PINT): scripts/build-go.sh
	@echo ">> building pint $(PINT_VERSION)"
	@scripts/build-go.sh $(BUILD) github.com/cloudflare/pint@$(PINT_VERSION) --version - pint=cmd/pint
	@touch $@
$(DASHBOARD_LINTER): scripts/build-go.sh
	@echo ">> building dashboard-linter $(DASHBOARD_LINTER_VERSION)"
	@scripts/build-go.sh $(BUILD) github.com/grafana/dashboard-linter@$(DASHBOARD_LINTER_VERSION) --version - \
		--sum $(DASHBOARD_LINTER_SUM) dashboard-linter=.
	@touch $@

## jsonnet: google/go-jsonnet's jsonnet, jsonnetfmt and jsonnet-lint into .build/bin (cached; the mixin's tools)
# `jsonnet --version` prints "... (Go implementation) v0.22.0", not "version 0.22.0": --version -,
# build-go.sh checks the module version with `go version -m`.
jsonnet: $(JSONNET)
$(JSONNET): scripts/build-go.sh
	@echo ">> building go-jsonnet $(JSONNET_VERSION)"
	@scripts/build-go.sh $(BUILD) github.com/google/go-jsonnet@$(JSONNET_VERSION) --version - \
		jsonnet=cmd/jsonnet jsonnetfmt=cmd/jsonnetfmt jsonnet-lint=cmd/jsonnet-lint
	@touch $@

## mixin: the monitoring mixin (mixin/) formatted, linted and evaluated by go-jsonnet into .build/mixin/ (rules files, PrometheusRule, dashboard)
MIXIN_SOURCES := $(wildcard mixin/*.libsonnet mixin/*.jsonnet)
mixin: $(JSONNET)
	@echo ">> checking and evaluating mixin/"
	@$(JSONNETFMT) --test $(MIXIN_SOURCES)
	@for f in $(MIXIN_SOURCES); do $(JSONNET_LINT) -J mixin $$f || exit 1; done
	@mkdir -p $(BUILD)/mixin
	@$(JSONNET) -S -m $(BUILD)/mixin mixin/render.jsonnet

## lint: the rules through pint, the dashboard through dashboard-linter, the mixin through jsonnetfmt and jsonnet-lint (exceptions: alerts/pint.hcl, dashboards/.lint)
lint: venv linters
	@$(PYTEST) -m linters

## test-exporter: blockstack-exporter's tests (fixtures, golden scrape, live on loop devices: root)
test-exporter: venv
	@$(PYTEST) exporters/tests

## test-ebpf: the BPF programs: static checks, --config.check --config.strict, live on loop devices (root)
test-ebpf: venv ebpf-build
	@$(PYTEST) ebpf-configs/tests

## test-alerts: promtool/amtool checks and rule unit tests on both server sets, collapse -> page end to end (root)
test-alerts: venv upstream-servers
	@$(PYTEST) alerts/tests

## metrics-doc: regenerate docs/metrics.md from the exporters' HELP strings and ebpf-configs/*.yaml
metrics-doc: venv
	@PYTHONPATH=exporters/tests $(VPY) exporters/tools/metrics_doc.py

## update-fixtures: rewrite exporters/tests/e2e-output.txt and doctor-output.txt, the golden outputs, after a reviewed change
update-fixtures: venv
	@$(PYTEST) exporters/tests/test_e2e.py exporters/tests/test_doctor.py --update-golden -k golden

## bench-doctor: blockstack-doctor's time on bench-exporter's 1026-device tree, and the findings collector's share of a scrape
bench-doctor: venv
	@$(VPY) exporters/bench/bench_doctor.py

## bench-exporter: scrape time of the exporter vs node_exporter diskstats on a 1024-device tree (BENCH_ARGS="--against REV", "--without all")
bench-exporter: venv
	@$(VPY) exporters/bench/bench_scrape.py $(BENCH_ARGS)

## fuzz-exporter: >= 10,000 damaged-input scrapes of the real exporter and HTTP abuse (~15 min; BENCHMARKS.md "Robustness")
fuzz-exporter: venv
	@PYTHONPATH=exporters/tests $(VPY) exporters/bench/fuzz_exporter.py $(FUZZ_ARGS)

## bench-ebpf: BPF ns per I/O vs upstream's examples/biolatency, fio 4 KiB random-read IOPS with all BPF configs attached vs none, and the BPF share of a read's CPU (perf)
bench-ebpf: venv ebpf-build
	@$(VPY) ebpf-configs/bench/bench_overhead.py

## run-exporter: blockstack-exporter in the foreground on 127.0.0.1:9363
run-exporter: venv
	@$(VENV)/bin/blockstack-exporter

STATE_DIR ?= $(CURDIR)/.state
STACKCTL  := $(VPY) deploy/stackctl.py --state $(STATE_DIR)

## up: install what is missing, render config into STATE_DIR, start everything under supervisord
##   SERVERS=debian (default: Debian's Prometheus 2 and Alertmanager) or SERVERS=upstream (Prometheus 3, built)
##   exposure only through UP_ARGS: --listen ADDR (TLS + basic auth), --auth (the same on loopback), --tls-cert/--tls-key/--tls-ca
SERVERS ?= debian
SERVERS_BUILT := $(if $(filter upstream,$(SERVERS)),upstream-servers)
up: deps venv ebpf-build grafana $(SERVERS_BUILT)
	@BLOCKSTACK_SERVERS=$(SERVERS) $(STACKCTL) up $(UP_ARGS)

## down: stop everything, keep data
down:
	@test -x $(VPY) && $(STACKCTL) down || echo "not set up"

## status: supervisord's status of every component (exit 3 when not running)
status:
	@$(STACKCTL) status

## logs: the last 20 lines of every component's log (STATE_DIR/logs/)
logs:
	@$(STACKCTL) logs

## clean: stop and remove the configuration and logs; the TSDB, pages, Grafana's database and secrets stay (FORCE=1: those too)
clean:
	@test -x $(VPY) && $(STACKCTL) clean $(if $(FORCE),--force) || echo "no $(VPY): remove $(STATE_DIR) by hand"

## distclean: also remove the virtual environment and build outputs
distclean: clean
	rm -rf $(BUILD) $(VENV)

## install-systemd: the role's commands as systemd units, enabled and started (root; STATE_DIR default /var/lib/blockstack-merges)
##   the agent role: make install-systemd UP_ARGS="--role agent --host db1 --listen 10.0.0.11 --alertmanager ..."
install-systemd: deps venv ebpf-build
	@BLOCKSTACK_SERVERS=$(SERVERS) $(VPY) deploy/stackctl.py install-systemd \
		--state $(if $(filter $(CURDIR)/.state,$(STATE_DIR)),/var/lib/blockstack-merges,$(STATE_DIR)) $(UP_ARGS)

## generate: render alerts/*.rules.yml, dashboards/block-stack-merges.json and the mixin (mixin/) with the knobs of alerts/config.yml, and docs/html/ (the runbook Prometheus serves)
generate: venv
	@echo ">> generating rules, dashboards and docs/html"
	@$(VPY) -m blockstack_rules.knobs
	@$(VPY) -m blockstack_rules.docs
	@$(VPY) dashboards/blockstack_dashboard.py
	@$(VPY) mixin/generate.py

## dashboard-screenshot: the dashboard in Grafana + chromium during a lab collapse, to docs/dashboard.png (root, ~3 minutes)
dashboard-screenshot: deps venv ebpf-build grafana
	@$(VPY) dashboards/tools/screenshot.py

## dashboard-screenshot-ranges: a backfilled week's collapses, the dashboard at 15 min, 24 h and 7 days, to docs/dashboard-15m.png, -24h.png and -7d.png (~2 minutes)
dashboard-screenshot-ranges: deps venv ebpf-build grafana
	@$(VPY) dashboards/tools/screenshot.py --ranges

## dashboard-screenshot-vm: the same during the NVMe incident in the VM lab (LVM snapshot over NVMe, Debian VM_SHOT_KERNEL), to docs/dashboard-vm.png (root, ~6-10 minutes)
VM_SHOT_KERNEL ?= 6.1
dashboard-screenshot-vm: deps vm-deps venv ebpf-build grafana
	@$(VPY) dashboards/tools/screenshot.py --vm $(VM_SHOT_KERNEL)

## bench-dashboard: time to every panel loaded in Grafana + chromium, slowest panel query (root, ~5 minutes)
bench-dashboard: deps venv ebpf-build grafana
	@$(VPY) dashboards/bench/bench_dashboard.py

## --- Kubernetes (docs/kubernetes.md): the chart charts/blockstack-merges, its image, its validation ---
# The schemas: the OpenAPI spec of each Kubernetes version (the k8s.io/kubernetes module) and the
# Prometheus Operator's CRDs, generated by controller-gen from the operator's Go types.
HELM_VERSION                := v3.22.0
KUBECONFORM_VERSION         := v0.8.0
CONTROLLER_TOOLS_VERSION    := v0.23.0
PROMETHEUS_OPERATOR_VERSION := v0.95.2
K8S_SCHEMA_VERSIONS         := 1.29.15 1.33.5
HELM           := $(BUILD)/bin/helm
KUBECONFORM    := $(BUILD)/bin/kubeconform
CONTROLLER_GEN := $(BUILD)/bin/controller-gen

## helm: helm, kubeconform and controller-gen from the Go module proxy into .build/bin (cached)
helm: $(HELM) $(KUBECONFORM) $(CONTROLLER_GEN)
$(HELM): scripts/build-go.sh
	@echo ">> building helm $(HELM_VERSION)"
	@scripts/build-go.sh $(BUILD) helm.sh/helm/v3@$(HELM_VERSION) --version - helm=cmd/helm
	@touch $@
$(KUBECONFORM): scripts/build-go.sh
	@echo ">> building kubeconform $(KUBECONFORM_VERSION)"
	@scripts/build-go.sh $(BUILD) github.com/yannh/kubeconform@$(KUBECONFORM_VERSION) --version - kubeconform=cmd/kubeconform
	@touch $@
$(CONTROLLER_GEN): scripts/build-go.sh
	@echo ">> building controller-gen $(CONTROLLER_TOOLS_VERSION)"
	@scripts/build-go.sh $(BUILD) sigs.k8s.io/controller-tools@$(CONTROLLER_TOOLS_VERSION) --version - controller-gen=cmd/controller-gen
	@touch $@

## k8s-schemas: kubeconform's JSON schemas of Kubernetes K8S_SCHEMA_VERSIONS and the Prometheus Operator's CRDs into .build/k8s-schemas (cached)
k8s-schemas: venv helm
	@PYTHON=$(VPY) charts/build-schemas.sh $(BUILD)/k8s-schemas $(CONTROLLER_GEN) \
		$(PROMETHEUS_OPERATOR_VERSION) $(K8S_SCHEMA_VERSIONS)

## chart: the mixin's PrometheusRule and dashboard (make mixin) copied into charts/blockstack-merges/files/mixin
chart: mixin
	@mkdir -p charts/blockstack-merges/files/mixin
	@cp $(BUILD)/mixin/prometheus-rule.yaml $(BUILD)/mixin/block-stack-merges.json charts/blockstack-merges/files/mixin/

## chart-image: the chart's image from the Debian package: mmdebstrap, podman import (cached by its inputs)
chart-image: deps venv deb
	@charts/image/build-image.sh $(BUILD)/k8s-image \
		$(BUILD)/deb/blockstack-merges-exporters_$(VERSION)-$(DEB_REVISION)_amd64.deb $(VERSION)

## test-chart: the chart: helm lint, kubeconform on each Kubernetes version, its pod run by podman with the ablation (root)
test-chart: deps venv helm k8s-schemas chart chart-image
	@$(PYTEST) charts/tests

## --- fleet (docs/fleet.md): Thanos + Alertmanager cluster across many hosts ----------------------
THANOS_VERSION := v0.42.5
THANOS         := $(BUILD)/bin/thanos

## thanos: build Thanos from the Go module proxy (Go toolchain go1.26.10 via GOTOOLCHAIN; cached)
# Upstream's release tags (.promu.yml); slicelabels is not optional: Thanos's labelpb casts
# Prometheus's labels.Labels to its protobuf labels in place, which is only valid for the slice
# implementation; without it the sidecar panics on its first gRPC answer.
thanos: $(THANOS)
$(THANOS): scripts/build-go.sh
	@echo ">> building thanos $(THANOS_VERSION)"
	@scripts/build-go.sh $(BUILD) github.com/thanos-io/thanos@$(THANOS_VERSION) --tags netgo,slicelabels thanos=cmd/thanos
	@touch $@  # the script may find it already built; make must see it fresh

## upstream-servers: Prometheus 3 (prometheus, promtool) and a current Alertmanager (alertmanager, amtool) from
##   the Go module proxy into .build/bin/NAME-VERSION (cached; versions pinned in deploy/blockstack_deploy/versions.py).
# Prometheus 3.X.Y is module version v0.3XX.Y. Tags: upstream's netgo, without builtinassets (the
# web UI is built by npm and is not in the module zip: the API works, the UI pages do not), plus
# remove_all_sd (cloud service discovery; one plugin's dependency is refused by the proxy; file
# and static discovery stay). Alertmanager 0.32+ embeds an npm-built UI missing from the module
# zip too (go:embed app/dist fails), so 0.31.1 is the newest that builds from the proxy.
# The versions are read from deploy/blockstack_deploy/versions.py, which the stack reads too.
pinned = $(shell sed -n 's/^$(1) = "\(.*\)"$$/\1/p' deploy/blockstack_deploy/versions.py)
PROMETHEUS3_VERSION   := $(call pinned,PROMETHEUS3_VERSION)
PROMETHEUS3_MODULE    := $(shell echo $(PROMETHEUS3_VERSION) | awk -F. '{ printf "v0.%d%02d.%d", $$1, $$2, $$3 }')
ALERTMANAGER_UPSTREAM_VERSION := $(call pinned,ALERTMANAGER_UPSTREAM_VERSION)
PROMETHEUS3           := $(BUILD)/bin/prometheus-$(PROMETHEUS3_VERSION)
ALERTMANAGER_UPSTREAM := $(BUILD)/bin/alertmanager-$(ALERTMANAGER_UPSTREAM_VERSION)
upstream-servers: $(PROMETHEUS3) $(ALERTMANAGER_UPSTREAM)
$(PROMETHEUS3): scripts/build-go.sh
	@echo ">> building prometheus $(PROMETHEUS3_VERSION)"
	@scripts/build-go.sh $(BUILD) github.com/prometheus/prometheus@$(PROMETHEUS3_MODULE) --version $(PROMETHEUS3_VERSION) \
		--tags netgo,remove_all_sd prometheus-$(PROMETHEUS3_VERSION)=cmd/prometheus promtool-$(PROMETHEUS3_VERSION)=cmd/promtool
	@touch $@  # the script may find it already built; make must see it fresh
$(ALERTMANAGER_UPSTREAM): scripts/build-go.sh
	@echo ">> building alertmanager $(ALERTMANAGER_UPSTREAM_VERSION)"
	@scripts/build-go.sh $(BUILD) github.com/prometheus/alertmanager@v$(ALERTMANAGER_UPSTREAM_VERSION) \
		alertmanager-$(ALERTMANAGER_UPSTREAM_VERSION)=cmd/alertmanager amtool-$(ALERTMANAGER_UPSTREAM_VERSION)=cmd/amtool
	@touch $@

## up-agent: the agent role on this host (exporters, Prometheus replica(s), Thanos sidecar);
##   e.g. make up-agent UP_ARGS="--host db1 --listen 10.0.0.11 --alertmanager 10.0.0.5:9093 --alertmanager 10.0.0.5:9095 --fleet-secrets DIR"
up-agent: deps venv ebpf-build thanos $(SERVERS_BUILT)
	@BLOCKSTACK_SERVERS=$(SERVERS) $(STACKCTL) up --role agent $(UP_ARGS)

## up-central: the central role (Thanos Query, 2 Alertmanager peers, watcher, receiver, Grafana)
up-central: deps venv thanos grafana $(SERVERS_BUILT)
	@BLOCKSTACK_SERVERS=$(SERVERS) $(STACKCTL) up --role central $(UP_ARGS)

## test-fleet: 3 hosts as network namespaces + the central role on this machine (root, ~4 minutes)
test-fleet: deps venv ebpf-build thanos upstream-servers
	@echo ">> running the fleet tests"
	@$(PYTEST) deploy/tests/fleet

## lab: the loop-device lab: every scenario against the stack (make up in LAB_STATE_DIR), narrated (needs root, ~15 min)
LAB_STATE_DIR ?= $(CURDIR)/.state-lab
LAB_ARGS      ?= all
lab: deps venv ebpf-build
	@LAB_STATE_DIR=$(LAB_STATE_DIR) $(VPY) -m blockstack_lab $(LAB_ARGS)

## bench-detection: the healthy and the sick corpus against a fresh `make up`: detection table, precision, recall (~25 min)
bench-detection: deps venv ebpf-build
	@$(VPY) lab/bench/bench_detection.py

## bench-cost: eBPF overhead, scrape time vs node_exporter, CPU/RSS per component, series per device
bench-cost: deps venv ebpf-build
	@$(VPY) lab/bench/bench_cost.py

## bench-servers: collapse onset -> page on Debian's Prometheus 2 and on Prometheus 3, side by side in one run (~5 min)
bench-servers: deps venv ebpf-build upstream-servers
	@$(VPY) lab/bench/bench_servers.py

## soak: 10 minutes of healthy mixed I/O against a fresh `make up`; zero pages expected
SOAK_MINUTES ?= 10
soak: deps venv ebpf-build
	@$(VPY) lab/bench/soak.py --minutes $(SOAK_MINUTES)

## --- the VM lab (lab/README.md "VM lab"): Debian's 5.10, 6.1, 6.12 and sid's newest under QEMU/TCG with emulated NVMe ----------

## vm-deps: QEMU, busybox, LVM2 and Debian's kernels: 6.1 and 6.12 from apt, bullseye's 5.10 and sid's newest through the lab's own apt configuration (virtme-ng comes with make venv); the Debian host's image (make debian-image)
vm-deps: vm-packages debian-image

## vm-packages: QEMU, busybox, LVM2 and the four kernels alone (scripts/install-vm.sh; no venv needed, so make -j runs it beside pip)
vm-packages: deps
	@scripts/install-vm.sh

## debian-image: the VM lab's Debian 12 host (lab/blockstack_lab/debian_host.py): its image by mmdebstrap and its local apt repo, cached in .build/debian (root; ~30 s to 2 min the first time, a second after)
debian-image: vm-packages venv
	@$(VPY) -m blockstack_lab.debian_host image repo

## vm-lab: the NVMe incident on a real LVM snapshot over emulated NVMe, on each kernel of VM_KERNELS (root, 6-11 min per kernel)
VM_KERNELS ?= 5.10 6.1 6.12 sid
vm-lab: deps vm-deps venv ebpf-build
	@$(VPY) -m blockstack_lab.vm_scenarios $(VM_KERNELS)

## vm-lab-stacks: md RAID1/RAID5, thin, dm-crypt, NVMe multipath, the LVM2 and the ext4 write-ups on 6.1 (root, 15-30 min)
vm-lab-stacks: deps vm-deps venv ebpf-build
	@$(VPY) -m blockstack_lab.vm_stacks

## test-kernels: the NVMe incident on every kernel of the VM lab's matrix: 5.10, 6.1, 6.12, sid (root, 25-35 min; results in BENCHMARKS.md)
test-kernels: deps vm-deps venv ebpf-build
	@BLOCKSTACK_VM_KERNELS=all $(PYTEST) -m vm lab/tests/test_vm_nvme.py --durations=0

## bench-kernels: BPF ns per I/O, ours vs upstream's biolatency, in a guest of each kernel of the matrix (root, ~15 min)
bench-kernels: deps vm-deps venv ebpf-build
	@$(VPY) lab/bench/bench_kernels.py

## test-vm-long: the VM scenarios too long for make test (pytest -m vm_long: the LVM2 and ext4 write-ups; root, 10-20 min)
test-vm-long: deps vm-deps venv ebpf-build helm chart chart-image
	@$(PYTEST) -m vm_long

## test-vm: the VM tier alone (pytest -m vm: the NVMe incident on 5.10 and sid, a 6.1 guest for thin/crypt/md/multipath; root, ~15 min quiet)
test-vm: deps vm-deps venv ebpf-build
	@$(PYTEST) -m "vm and not vm_long"
