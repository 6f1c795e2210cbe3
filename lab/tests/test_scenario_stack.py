"""A non-paging scenario end to end against the real stack (exporters, Prometheus with the rules,
Alertmanager, the receiver): the lineup reaches Prometheus and nothing pages. Scrapes every 2 s
so the rate windows fill quickly; the rules are the production ones."""

import os

import pytest

from blockstack_deploy.stack import Stack
from blockstack_lab import corpus, scenarios
from blockstack_lab.lab import Lab
from blockstack_lab.view import StackView

pytestmark = [pytest.mark.root, pytest.mark.servers]


def test_random_4k_is_seen_and_does_not_page(lab_prerequisites, tmp_path):
    stack = Stack(str(tmp_path / "stack"), scrape_interval="2s", evaluation_interval="2s")
    missing = stack.missing()
    assert not missing, "the stack needs: " + "; ".join(missing)
    timing = scenarios.Timing(quiet=30, narrate_every=10, settle_timeout=30)
    with stack.running(timeout=120):
        view = StackView.from_stack(stack)
        view.prometheus.wait_targets_up(timeout=60)
        with Lab() as lab:
            runner = scenarios.Runner(lab, view, timing)
            checks = corpus.run(runner, ["random-4k"])
            single = lab.name("single")
            lineup = view.lineup([single])
            ours = set(lab.names().values())
        lab_dir = lab.dir
    assert len(checks) == 1 and checks[0].correct, checks
    assert checks[0].observed == "no page"
    # the stack saw the load: random 4 KiB requests are 8 sectors
    for op in ("read", "write"):
        rate, sectors = lineup[single][op]
        assert rate > 50 and 7 <= sectors <= 9, lineup
    # and the narration showed Prometheus's lineup of it
    assert any(n["source"] == "Prometheus" and n["lineup"].get(single) for n in runner.narration), (
        runner.narration
    )
    # only the lab's devices: the machine's other loop devices (other users' tests) may page
    assert not [n for n in view.notifications() if n.path == "/page" and n.device in ours], (
        "paged for random 4 KiB I/O"
    )
    assert not os.path.exists(lab_dir)
