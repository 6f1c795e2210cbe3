"""The versions of the upstream servers (`SERVERS=upstream`), pinned here and nowhere else: the
stack runs .build/bin/NAME-VERSION (stack.SERVERS) and the Makefile reads these two lines to build
them from the Go module proxy (`make upstream-servers`; Prometheus 3.X.Y is the Go module
v0.3XX.Y). Keep each a plain `NAME = "VERSION"` line: the Makefile reads them with sed."""

PROMETHEUS3_VERSION = "3.16.0"
ALERTMANAGER_UPSTREAM_VERSION = "0.31.1"
