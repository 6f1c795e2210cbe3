"""The loop-device lab: reproduce block-layer incidents on this machine and watch the stack catch them.

    python -m blockstack_lab list
    python -m blockstack_lab run SCENARIO [SCENARIO ...] [--state DIR] [--keep-stack]
    python -m blockstack_lab all [--state DIR] [--keep-stack]
    python -m blockstack_lab run healthy sick          (the detection corpora; or single cases)
    python -m blockstack_lab run random-4k --no-stack        (no stack: iostat's view only)
    python -m blockstack_lab sweep      (undo a lab whose process was SIGKILLed)

`run`/`all` start the whole stack with `make up` in a lab state directory (default
$LAB_STATE_DIR or .state-lab in the repository, on free ports the first time, kept in its
ports.json) or reuse the one running there, build the lab (a stacked pair of loop devices with
ext4 on top, and a single loop device), run each scenario with fio and narrate what the stack
sees: the lineup per layer, the alert state, the page at the receiver. At the end it prints the
detection table and leaves the machine as it found it: no loop device, mount, fio or changed
sysfs setting, also after a failure, Ctrl-C or SIGTERM. A stack it started is stopped again
(`make down`, data kept) unless --keep-stack; one that was running keeps running. Only SIGKILL
cannot be handled: `sweep` undoes such a lab from the journal it keeps in its directory.
Needs root, fio, and `make up`'s prerequisites. Exit status: 0 all as expected, 1 not, 130 interrupted.
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

from blockstack_deploy.stack import COMPONENTS, REPO
from blockstack_deploy.supervisor import Supervisor
from blockstack_testsupport import procs

from . import corpus, pipeline, report, scenarios
from .lab import LAB_ROOT, Lab, Terminated, install_signal_handlers, signals_deferred, sweep_stale
from .view import StackView

DEFAULT_STATE = os.path.join(REPO, ".state-lab")


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def missing_requirements(with_stack=True):
    problems = [] if os.geteuid() == 0 else ["needs root (loop devices, mounts, sysfs, BPF)"]
    problems += [
        f"{tool} is not installed (run make deps)"
        for tool in ("fio", "losetup", "mkfs.ext4", "make")
        if shutil.which(tool) is None
    ]
    if not os.path.isdir(LAB_ROOT):
        problems.append(f"{LAB_ROOT} is missing (the lab keeps its backing files there)")
    if with_stack and not os.access(os.path.join(REPO, ".venv", "bin", "python"), os.X_OK):
        problems.append("no .venv (run make venv)")
    return problems


def make(target, state, up_args="", timeout=900):
    argv = ["make", "-s", "-C", REPO, target, f"STATE_DIR={state}"] + (
        [f"UP_ARGS={up_args}"] if up_args else []
    )
    argv += ["FORCE=1"] if target == "clean" else []  # the lab's state directories are its own
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"make {target} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


@contextlib.contextmanager
def lab_stack(state, keep=False):
    """`make up` in `state` (free ports the first time); yields a StackView. Stops it on exit
    (`make down`, data kept) if it was not running before and keep is false."""
    state = os.path.abspath(state)
    was_running = Supervisor(state).pid() is not None
    up_args = ""
    if not os.path.exists(os.path.join(state, "ports.json")):
        # not the defaults: a developer's own `make up` may hold 9090, 9093, ...
        up_args = " ".join(f"--port {c}={procs.free_port()}" for c in (*COMPONENTS, "grafana"))
    say(f"stack: {'reusing the one running in' if was_running else 'make up in'} {state}")
    try:
        out = make("up", state, up_args)
        for line in out.splitlines():
            say(f"  {line}")
        view = StackView.from_state(state)
        view.prometheus.wait_targets_up(timeout=90)
        yield view
    finally:
        if not was_running and not keep:
            with signals_deferred():
                say(f"stack: make down (it was not running before; data kept in {state})")
                with contextlib.suppress(Exception):
                    make("down", state, timeout=180)
        elif Supervisor(state).pid() is not None:
            say(f"stack: still running in {state} (make down STATE_DIR={state} to stop it)")


def run(names, state, no_stack=False, keep=False, timing=None, say=say):
    """The lab's run; returns every Check. Its prerequisites, the stack (`make up` in `state`, or
    none), the lab's devices (lab.Lab), then each scenario and corpus case in order
    (pipeline.run; a case: its devices, its workload, the wait for the pages, the evidence, the
    verdict); on leaving, also after a failure, the lab undone and the stack stopped (lab_stack)."""
    problems = missing_requirements(with_stack=not no_stack)
    if problems:
        raise SystemExit("cannot run the lab: " + "; ".join(problems))
    with contextlib.ExitStack() as es:
        view = None if no_stack else es.enter_context(lab_stack(state, keep))
        lab = es.enter_context(Lab(say=say))
        return pipeline.run(scenarios.Runner(lab, view, timing, say=say), corpus.plan(names))


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m blockstack_lab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the scenarios and what each expects")
    sub.add_parser(
        "sweep", help="undo labs left by a killed process (SIGKILL): settings, mounts, loop devices"
    )
    for name, helptext in (("run", "run the named scenarios"), ("all", "run every scenario")):
        sp = sub.add_parser(name, help=helptext)
        if name == "run":
            sp.add_argument("scenario", nargs="+", choices=corpus.known())
        sp.add_argument(
            "--state",
            default=os.environ.get("LAB_STATE_DIR", DEFAULT_STATE),
            help="state directory of the lab's stack (default $LAB_STATE_DIR or %(default)s)",
        )
        sp.add_argument(
            "--no-stack",
            action="store_true",
            help="no stack: run the workloads, narrate iostat figures",
        )
        sp.add_argument(
            "--keep-stack", action="store_true", help="leave a stack this run started running"
        )
        sp.add_argument(
            "--warmup", type=float, help="seconds of healthy load before a fault (default 25)"
        )
        sp.add_argument(
            "--quiet", type=float, help="seconds a must-not-page phase lasts (default 75)"
        )
        sp.add_argument("--json", metavar="FILE", help="also write the checks to FILE as JSON")
    args = p.parse_args(argv)

    if args.command == "list":
        for name in corpus.known():
            print(f"{name}\n    {corpus.describe(name)}")
        return 0

    if args.command == "sweep":
        swept = sweep_stale(say=say)
        say(f"swept {len(swept)} stale lab(s)")
        return 0

    install_signal_handlers()
    timing = scenarios.Timing()
    if args.warmup is not None:
        timing.warmup = timing.corpus_warmup = args.warmup
    if args.quiet is not None:
        timing.quiet = timing.journal_quiet = timing.corpus_quiet = args.quiet
    names = list(scenarios.SCENARIOS) if args.command == "all" else args.scenario
    try:
        checks = run(names, args.state, args.no_stack, args.keep_stack, timing)
    except Terminated:
        say("terminated (SIGTERM); everything the lab made is undone")
        return 143
    except KeyboardInterrupt:
        say("interrupted; everything the lab made is undone")
        return 130
    print()
    print(report.table(checks))
    if any(c.scenario in corpus.CASES for c in checks):
        print(corpus.format_summary(corpus.summary(checks)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([c.__dict__ for c in checks], f, indent=1)
    wrong = [c for c in checks if not c.correct]
    say(f"{len(checks) - len(wrong)} of {len(checks)} checks as expected")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
