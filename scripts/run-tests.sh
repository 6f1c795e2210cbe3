#!/usr/bin/env bash
# `make test`'s runner: builds what the tests need and runs every test but the long tiers (`make
# test-long`, `make test-vm-long`),
# each part as soon as its inputs exist.
#
#   scripts/run-tests.sh                build, and test as the inputs arrive (below); exit 0 when
#                                       every part passed. Extra arguments go to the two pytest runs
#                                       beside the VM tier.
#   scripts/run-tests.sh --start-vm     (make test-vm-start) start the VM tier, return at once
#   scripts/run-tests.sh --early-ready  (make test-early) the early tests' inputs are there
#
# One `make -j` builds test-inputs in the background, so that the Go builds (CPU, one compile at a
# time: scripts/build-go.sh) run while apt, pip, the kernels' fetch and the images wait on the
# network. One after the other they took ~23 min on a fresh machine, and the tests waited for all
# of them. Now three test runs start as their inputs arrive:
#   1. the VM tier (marker `vm`: Debian kernels under QEMU/TCG, one guest at a time, one core for
#      most of the run), from make (test-vm-start) once deps, vm-deps, venv and ebpf-build are done;
#   2. the early tests: every other test but those marked `built` or `linters` (they run programs
#      built from the Go module proxy), from here once make has done test-early (deps, venv,
#      ebpf-build, grafana): beside the remaining Go builds, whose CPU fills the time these tests
#      spend waiting on servers' scrape and rule intervals;
#   3. the `built` and `linters` tests, once the build is over and the early tests are done.
# Runs 2 and 3 use TEST_WORKERS pytest-xdist workers, a test file per worker (a file's module
# fixtures, e.g. one Grafana lab, stay in one worker). The build's log and the VM tier's are printed
# when each ends; the run fails if the build or any run fails, and stops the VM tier if it ends early.
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=${PYTEST:-.venv/bin/pytest}
state=${VM_TEST_STATE:-.build/test-vm}
log=$state/log
make=${MAKE:-make}

case ${1:-} in
  --start-vm)
    mkdir -p "$state"
    rm -f "$state/rc"
    # its own session (setsid): the whole tier, guests included, is one process group to stop
    setsid bash -c '"$1" -m "vm and not vm_long and not long" --durations=10 >"$2" 2>&1; echo $? >"$3.tmp"; mv "$3.tmp" "$3"' \
      vm-tier "$pytest" "$log" "$state/rc" </dev/null >/dev/null 2>&1 &
    echo $! >"$state/pid"
    echo ">> the VM tier started (pytest -m vm, pid $!), its output in $log"
    exit 0 ;;
  --early-ready)
    mkdir -p "$state"
    touch "$state/early"
    exit 0 ;;
esac

stop_vm() {
  if [ -f "$state/pid" ] && [ ! -f "$state/rc" ]; then
    echo ">> stopping the VM tier"
    kill -INT -- "-$(cat "$state/pid")" 2>/dev/null
    for _ in $(seq 60); do [ -f "$state/rc" ] && break; sleep 1; done
    kill -KILL -- "-$(cat "$state/pid")" 2>/dev/null
  fi
}
fail() {
  echo ">> $*" >&2
  stop_vm
  exit 1
}
mkdir -p "$state"
rm -f "$state/pid" "$state/rc" "$state/early" "$state/build-rc"
build=
trap 'stop_vm; [ -z "$build" ] || kill "$build" 2>/dev/null; exit 130' INT TERM

# The VM tier's inputs first in line. Each line of the build's log is stamped with the seconds
# since it began (BENCHMARKS.md's step table is read off them); a recipe line's output shows when
# it ends (-Oline), its ">> building X" banner when it starts. A Go build waiting for the compile
# lock holds one of make's slots: with -j4, four of them held all four and the VM tier's inputs
# waited 5 min for one.
jobs=${BUILD_JOBS:-12}
echo ">> building what the tests need in the background (make -j$jobs test-vm-start test-early test-inputs), its log in $state/build.log"
start=$EPOCHSECONDS
{
  $make --no-print-directory -j"$jobs" -Oline test-vm-start test-early test-inputs 2>&1
  echo $? >"$state/build-rc"
} | while IFS= read -r line; do printf '[%4d s] %s\n' $((EPOCHSECONDS - start)) "$line"; done \
  >"$state/build.log" &
build=$!

built=
build_done() {
  built=1
  wait "$build"
  echo ">> the build's log ($state/build.log):"
  cat "$state/build.log"
  [ "$(cat "$state/build-rc" 2>/dev/null)" = 0 ] || fail "the build failed"
  echo ">> built in $((EPOCHSECONDS - start)) s"
}

while [ ! -f "$state/early" ] && kill -0 "$build" 2>/dev/null; do sleep 1; done
[ -f "$state/early" ] || build_done  # ended before the early inputs: it failed, or all was built
echo ">> the early tests, at $((EPOCHSECONDS - start)) s (pytest -m \"not vm and not vm_long and not long and not built and not linters\", ${TEST_WORKERS:-2} workers)"
"$pytest" -m "not vm and not vm_long and not long and not built and not linters" -n "${TEST_WORKERS:-2}" \
  --dist loadfile --durations=25 "$@"
early=$?

[ -n "$built" ] || build_done
echo ">> the built and linters tests, at $((EPOCHSECONDS - start)) s (pytest -m \"(built or linters) and not vm and not vm_long and not long\", ${TEST_WORKERS:-2} workers)"
"$pytest" -m "(built or linters) and not vm and not vm_long and not long" -n "${TEST_WORKERS:-2}" \
  --dist loadfile --durations=25 "$@"
late=$?

echo ">> waiting for the VM tier"
while [ ! -f "$state/rc" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; do sleep 2; done
vm=$(cat "$state/rc" 2>/dev/null || echo "none (the tier died)")
echo ">> the VM tier's output ($log):"
cat "$log"
echo ">> at $((EPOCHSECONDS - start)) s: the early tests: exit $early; the built and linters tests: exit $late; the VM tier: exit $vm"
[ "$early" = 0 ] && [ "$late" = 0 ] && [ "$vm" = 0 ]
