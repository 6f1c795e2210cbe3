"""The corpus as data: cases the runner can run, sick cases that never inherit the previous
one's page, and the precision/recall arithmetic of bench-detection."""

from blockstack_lab import corpus, scenarios

ROLES = {"single", "single2", "upper", "lower", "upper2", "lower2"}
FILESYSTEMS = {"upper", "lower", "upper2", "lower2"}
OWN_FILESYSTEMS = {"tlower", "pdisk1"}  # the devices a case makes for itself that hold a filesystem


def test_every_case_names_known_devices_and_settings():
    for case in corpus.HEALTHY + corpus.SICK:
        assert set(case.own) <= set(corpus.OWN), case.name
        own = {role for group in case.own for role in corpus.OWN[group]}
        roles, filesystems = ROLES | own, FILESYSTEMS | (OWN_FILESYSTEMS & own)
        assert case.workloads, case.name
        for target, args in case.workloads:
            role = target.split(":", 1)[-1]
            assert role in (filesystems if target.startswith("fs:") else roles), (case.name, target)
            assert not any(a.startswith(("--filename", "--directory", "--name")) for a in args), (
                case.name
            )
        for role, attr in {**case.settings, **case.fault}:
            assert role in roles and attr.startswith("queue/"), (case.name, role, attr)
        assert set(case.pages) <= roles
        # a sick case changes something at onset; a healthy one does not
        assert bool(case.fault) == case.sick, case.name
        assert set(case.roles()) <= roles
        # only a case's own devices come and go
        assert set(case.churn) | set(case.fix_remove) <= own, case.name
        assert not case.fix_remove or case.sick, case.name


def test_healthy_corpus_covers_the_workload_shapes_that_must_not_page():
    args = [" ".join(a) for c in corpus.HEALTHY for _, a in c.workloads]
    assert any("--rw=randrw --bs=4k" in a for a in args) and any("--bs=8k" in a for a in args)
    unbatched = [
        a
        for a in args
        if "--rw=read --bs=4k --direct=1 --ioengine=libaio" in a and "batch" not in a
    ]
    assert len({a.split("--iodepth=")[1].split()[0] for a in unbatched}) >= 3, (
        "several queue depths"
    )
    assert any("--sync=dsync" in a for a in args) and any("--fdatasync=1" in a for a in args)
    assert any("--bs=1m" in a for a in args) and any("--direct=0" in a for a in args)
    assert any(
        v == "1"
        for c in corpus.HEALTHY
        for (_, attr), v in c.settings.items()
        if attr == "queue/nomerges"
    )


def test_consecutive_sick_cases_use_different_devices():
    # a page is held by keep_firing_for after the fix: the next case must not see it
    for a, b in zip(corpus.SICK, corpus.SICK[1:]):
        assert not set(a.roles()) & set(b.roles()), (a.name, b.name)


def test_expand():
    assert corpus.expand(["healthy"]) == [c.name for c in corpus.HEALTHY]
    assert corpus.expand(["corpus"]) == [c.name for c in corpus.HEALTHY + corpus.SICK]
    assert corpus.expand(["stack-split", "sick-two-stacks"]) == ["stack-split", "sick-two-stacks"]
    for name in corpus.known():
        assert corpus.describe(name)


def _check(name, true_pages, false_pages, expected_pages, secs=()):
    c = scenarios.Check(name, "", "", "", false_pages == 0 and true_pages == expected_pages)
    c.true_pages, c.false_pages, c.expected_pages = true_pages, false_pages, expected_pages
    c.page_seconds = dict(enumerate(secs))
    return c


def test_summary_counts_pages():
    checks = [
        _check("healthy-random", 0, 0, 0),
        _check("healthy-streaming", 0, 1, 0),
        _check("sick-two-stacks", 2, 0, 2, (30, 33)),
        _check("sick-nomerges2-read", 0, 0, 1),
        _check("sick-intermittent", 1, 1, 1, (28,)),
        scenarios.Check("trickle", "", "", "", True),
    ]
    s = corpus.summary(checks)
    assert (s["cases"], s["healthy"], s["sick"]) == (5, 2, 3)
    assert (s["true_pages"], s["false_pages"], s["missed_pages"]) == (3, 2, 1)
    assert s["precision"] == 3 / 5 and s["recall"] == 3 / 4
    assert s["page_seconds"] == [28, 30, 33]
