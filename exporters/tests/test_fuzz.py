"""End-to-end fuzz test (short; `make fuzz-exporter` runs >= 10,000 iterations): the real exporter
over HTTP while the files and commands it reads are damaged (tests/fuzzing.py). Every scrape
answers 200 with an exposition promtool accepts, in bounded time and memory, and every damage
that drops a value is counted in blockstack_collector_errors_total."""

import random

import pytest
from fuzzing import COMMAND_DAMAGES, DAMAGES, TARGETS, Fuzzer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockstack_testsupport import procs
from blockstack_testsupport.clock import seconds

MAX_SECONDS = 5.0  # the stack's scrape timeout
MAX_RSS = 150 << 20


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory):
    fz = Fuzzer(str(tmp_path_factory.mktemp("fuzz")))
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    with procs.running(
        fz.argv(port), env=fz.env(), health_url=url + "/", log_path=fz.log_path
    ) as proc:
        fz.calibrate(url)
        yield fz, url, proc.pid


damage = st.tuples(st.integers(0, len(TARGETS) - 1), st.integers(0, 100), st.integers(0, 2**32))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(damage, min_size=1, max_size=3, unique_by=lambda d: d[0]))
def test_damaged_inputs_never_fail_the_scrape(fuzzer, damages):
    fz, url, pid = fuzzer
    rng = random.Random(damages[0][2])
    chosen = []
    for target, which, _ in damages:
        choices = (
            COMMAND_DAMAGES[:-1] if TARGETS[target][1] == "command" else DAMAGES
        )  # no hangs here
        chosen.append((TARGETS[target], choices[which % len(choices)]))
    problems = fz.iteration(url, pid, chosen, promtool=True, rng=rng)
    assert not problems, (chosen, problems)
    assert fz.stats["slowest"] < seconds(MAX_SECONDS)
    assert fz.stats["peak_rss"] < MAX_RSS
