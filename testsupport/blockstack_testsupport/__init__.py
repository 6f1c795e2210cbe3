"""What the tests, the benchmarks and the lab share and production code never runs. Installed
by `make venv` (editable), left out of the Debian package (packaging/build-deb.sh).

Timing in a test (a machine loaded by other work runs late; a test must not fail for that):
- A test that waits for something waits for the state it means, with clock.wait_until(what,
  predicate, timeout, interval) (also procs.wait_until), then asserts the fact. No fixed
  time.sleep() before an assertion, no poll loop of its own.
- Assert the mechanism, not a proxy of it: which thread or process exists, what was counted or
  written, not how many threads or processes there are at an instant or what a short interval
  happened to hold.
- A deadline that is itself what a test guards ("answered within 1 s") is clock.seconds(1).
- Every deadline comes from clock.seconds(): BLOCKSTACK_TEST_TIME_FACTOR (default 1) stretches
  them all on a slow machine. Retrying a failed test is no fix.
"""
