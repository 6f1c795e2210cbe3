#!/usr/bin/env bash
# `make test`'s runner: builds what the tests need, all at once, and runs every test but the long
# VM scenarios in two pytest processes side by side.
#
#   scripts/run-tests.sh              build (make -j), the VM tier in the background as soon as its
#                                     inputs exist, then every other test; exit 0 when both passed
#   scripts/run-tests.sh --start-vm   (the Makefile's test-vm-start) start the VM tier, return at once
#
# The builds: one `make -j` of test-inputs, so the Go builds (CPU) run while apt, the kernels'
# fetch, mmdebstrap and pip wait on the network; one after the other they took ~23 min on a
# fresh machine. The VM tier (marker `vm`: Debian kernels under QEMU/TCG, one guest at a time)
# keeps one core busy for most of the run: it starts from make (test-vm-start) once deps, vm-deps,
# venv and ebpf-build are done, beside the remaining Go builds, not after them. Every other test
# runs in TEST_WORKERS pytest-xdist workers, a test file per worker (a file's module fixtures, e.g.
# one Grafana lab, stay in one worker): most of them wait on servers' scrape and rule intervals.
# The VM tier's output goes to its log and is printed after the rest; the run fails if the build
# or either process fails, and the VM tier is stopped when the run ends early. Extra arguments go
# to the rest's pytest only.
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=${PYTEST:-.venv/bin/pytest}
state=${VM_TEST_STATE:-.build/test-vm}
log=$state/log
make=${MAKE:-make}

if [ "${1:-}" = --start-vm ]; then
  mkdir -p "$state"
  rm -f "$state/rc"
  # its own session (setsid): the whole tier, guests included, is one process group to stop
  setsid bash -c '"$1" -m "vm and not vm_long" --durations=10 >"$2" 2>&1; echo $? >"$3.tmp"; mv "$3.tmp" "$3"' \
    vm-tier "$pytest" "$log" "$state/rc" </dev/null >/dev/null 2>&1 &
  echo $! >"$state/pid"
  echo ">> the VM tier started (pytest -m vm, pid $!), its output in $log"
  exit 0
fi

stop_vm() {
  if [ -f "$state/pid" ] && [ ! -f "$state/rc" ]; then
    echo ">> stopping the VM tier"
    kill -INT -- "-$(cat "$state/pid")" 2>/dev/null
    for _ in $(seq 60); do [ -f "$state/rc" ] && break; sleep 1; done
    kill -KILL -- "-$(cat "$state/pid")" 2>/dev/null
  fi
}
trap 'stop_vm; exit 130' INT TERM
rm -f "$state/pid" "$state/rc"

# Each line of the build's output is stamped with the seconds since it began (the step table of
# BENCHMARKS.md "Test and build times" is read off them): a step's ">> building X" is its start,
# lines are passed on as they come (-Oline), never held back to a step's end.
# The VM tier's inputs first in line. Jobs: a Go build waiting for the compile lock
# (scripts/build-go.sh) holds one of make's slots, so there are enough for every Go build to wait
# while apt, pip, the kernels and the images still get theirs (with -j4, four Go builds held all
# four and the VM tier's inputs waited 5 min for a slot).
jobs=${BUILD_JOBS:-12}
echo ">> building what the tests need (make -j$jobs test-vm-start test-inputs)"
start=$EPOCHSECONDS
$make --no-print-directory -j"$jobs" -Oline test-vm-start test-inputs 2>&1 |
  while IFS= read -r line; do printf '[%4d s] %s\n' $((EPOCHSECONDS - start)) "$line"; done
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
  stop_vm
  echo ">> the build failed" >&2
  exit 1
fi
echo ">> built in $((EPOCHSECONDS - start)) s"

echo ">> every other test (pytest -m \"not vm and not vm_long\", ${TEST_WORKERS:-2} workers)"
"$pytest" -m "not vm and not vm_long" -n "${TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
rest=$?

echo ">> waiting for the VM tier"
while [ ! -f "$state/rc" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; do sleep 2; done
vm=$(cat "$state/rc" 2>/dev/null || echo "none (the tier died)")
echo ">> the VM tier's output ($log):"
cat "$log"
echo ">> every other test: exit $rest; the VM tier: exit $vm"
[ "$rest" = 0 ] && [ "$vm" = 0 ]
