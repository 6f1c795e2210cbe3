"""The lab's run, read top to bottom: `run` takes the scenarios and corpus cases of a plan
(corpus.plan) in order on one runner (scenarios.Runner: the lab, the stack's view, the timing),
`run_case` takes one corpus case through its steps, each a call into the module whose job it is:

    prepare its devices      case_devices.prepare, case_devices.churn, Lab.setting
    wait for a quiet start   evidence.settle
    run its workload         case_devices.start_workloads
    apply the fault          lab.setting, here in `fault` (sick cases, after a healthy warmup)
    wait for the pages       evidence.wait_pages (healthy: Runner.watch)
    collect the evidence     evidence.collect
    judge                    verdict.judge, and verdict.pages_after_fix after a fix by removal

A named scenario (scenarios.SCENARIOS) is one call: it runs its own phases with Runner.observe.
At the end `evidence.resolves` fills in the seconds from each fix to its resolve. Everything a
step makes is undone when its `with` closes, in reverse order, also after a failure.
"""

import contextlib
import time

from . import case_devices, evidence, scenarios, verdict
from .lab import CleanupStack


def run(r, plan):
    """Run the plan's [(name, description, Case or None)] in order on runner r; returns every
    Check."""
    checks = []
    for name, description, case in plan:
        r.say(f"== {name}: {description}")
        if case is None:
            r.settle()
            checks += scenarios.SCENARIOS[name](r)
        else:
            checks.append(run_case(r, case))
    evidence.resolves(r, checks)
    return checks


def run_case(r, case):
    """Run one corpus case; returns its Check (resolve time filled in later by `run`)."""
    lab, roles = r.lab, case.roles()
    with CleanupStack() as es:
        own = case_devices.prepare(lab, case, es)
        devices = {lab.name(role) for role in roles}
        evidence.settle(r, devices)
        for role in case.churn:
            case_devices.churn(r, own, role, case.name)
            devices.add(lab.name(role))
        for (role, attr), value in case.settings.items():
            es.enter_context(lab.setting(role, attr, value))
        fios = case_devices.start_workloads(r, case, es)
        if not case.sick:
            onset = time.time()
            r.say(f"{case.name}: {case.doc}; watching {r.t.corpus_quiet:.0f} s")
            r.watch(r.t.corpus_quiet, roles, onset)
            return verdict.judge(r, case, onset, evidence.collect(r, onset, devices))
        r.say(f"{case.name}: healthy for {r.t.corpus_warmup:.0f} s first")
        r.watch(r.t.corpus_warmup, roles)
        onset = time.time()
        if case.intermittent:
            return intermittent(r, case, onset, devices)
        if case.fix_remove:
            return fixed_by_removal(r, case, onset, devices, own, fios)
        with fault(lab, case):
            evidence.wait_pages(r, case, onset)
            check = verdict.judge(r, case, onset, evidence.collect(r, onset, devices))
            check.fixed_at = time.time()
        return check


@contextlib.contextmanager
def fault(lab, case):
    """The case's fault (its settings at onset) for the body."""
    with CleanupStack() as es:
        for (role, attr), value in case.fault.items():
            es.enter_context(lab.setting(role, attr, value))
        yield


def intermittent(r, case, onset, devices):
    """The fault on for `on` seconds and off for `off`, `cycles` times; the fix is the last flip
    back."""
    on, off, cycles = case.intermittent
    roles = case.roles()
    for c in range(cycles):
        with fault(r.lab, case):
            r.watch(on, roles, onset)
        fixed_at = time.time()
        r.say(f"+{time.time() - onset:.0f}s healthy again for {off} s (cycle {c + 1} of {cycles})")
        r.watch(off, roles, onset)
    check = verdict.judge(r, case, onset, evidence.collect(r, onset, devices))
    check.fixed_at = fixed_at
    return check


def fixed_by_removal(r, case, onset, devices, own, fios):
    """The fault until the pages arrive; then the fix: the roles in `fix_remove` removed (their
    fios stopped first, a removed device taking its setting along), and as long as a healthy case
    watched for pages that start after it."""
    lab = r.lab
    with CleanupStack() as faults:
        for (role, attr), value in case.fault.items():
            stack = own.stacks[role] if role in case.fix_remove else faults
            stack.enter_context(lab.setting(role, attr, value))
        evidence.wait_pages(r, case, onset)
        check = verdict.judge(r, case, onset, evidence.collect(r, onset, devices))
        check.fixed_at = time.time()
        for role in case.fix_remove:
            if role in fios:
                fios.pop(role).close()
            own.remove(role)
        r.say(
            f"{case.name}: fixed by removing {', '.join(case.fix_remove)}; "
            f"watching {r.t.corpus_quiet:.0f} s"
        )
        r.watch(r.t.corpus_quiet, [x for x in case.roles() if x in lab.devices])
        if r.view is not None:
            late = evidence.pages_since(r, check.fixed_at + 1, devices)
            verdict.pages_after_fix(r, case, check, late)
    return check
