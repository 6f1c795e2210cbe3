#!/usr/bin/env bash
# `make test`'s runner: every test but the long VM scenarios, in two pytest processes at once.
# The VM tier (marker `vm`: Debian kernels under QEMU/TCG, one guest at a time) keeps one core
# busy for minutes, while most other tests wait on servers' scrape and rule intervals: those run
# in TEST_WORKERS pytest-xdist workers, a test file per worker (a file's module fixtures, e.g. one
# Grafana lab, stay in one worker). One after the other they took 41 min. The VM tier's output
# goes to its log and is printed after the rest; the run fails if either process fails. Extra
# arguments go to both pytest processes.
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=${PYTEST:-.venv/bin/pytest}
log=${VM_TEST_LOG:-.build/test-vm.log}
mkdir -p "$(dirname "$log")"

echo ">> the VM tier in the background (pytest -m vm), its output in $log"
"$pytest" -m "vm and not vm_long" --durations=10 "$@" >"$log" 2>&1 &
vm_pid=$!
trap 'kill -INT "$vm_pid" 2>/dev/null; wait "$vm_pid"' INT TERM

echo ">> every other test (pytest -m \"not vm and not vm_long\", ${TEST_WORKERS:-2} workers)"
"$pytest" -m "not vm and not vm_long" -n "${TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
rest=$?

echo ">> waiting for the VM tier"
wait "$vm_pid"
vm=$?
echo ">> the VM tier's output ($log):"
cat "$log"
echo ">> every other test: exit $rest; the VM tier: exit $vm"
[ "$rest" -eq 0 ] && [ "$vm" -eq 0 ]
