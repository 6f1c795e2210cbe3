"""The lab leaves the machine as it found it when it is interrupted midway: a scenario in a
subprocess gets SIGINT (Ctrl-C) or SIGTERM after it has changed a sysfs setting, and afterwards
no loop device over its files, no mount, no fio of its own and no changed setting remain. What the
lab made and changed is read from its journal (lab.json in its directory)."""

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from blockstack_deploy.stack import REPO
from blockstack_lab import loop
from blockstack_lab.lab import JOURNAL, LAB_ROOT, lab_mounts
from blockstack_testsupport import procs

pytestmark = [pytest.mark.root]


def _leftovers(lab_dir, tag, changed):
    problems = []
    if os.path.exists(lab_dir):
        problems.append(f"lab directory {lab_dir} still exists")
    for dev, back in loop.attached_devices().items():
        if back.startswith(lab_dir):
            problems.append(f"{dev} still attached over {back}")
    problems += [f"still mounted: {m}" for m in lab_mounts(lab_dir)]
    fios = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    problems += [f"fio still running: pid {p}" for p in fios]
    for dev, attr, old, _ in changed:
        now = loop.read_sysfs(dev, attr)
        if now != old:
            problems.append(f"{dev} {attr} is {now}, was {old}")
    return problems


def _journal(pid):
    """The journal of the lab process `pid` runs, once it has one."""
    for path in glob.glob(os.path.join(LAB_ROOT, "blockstack-lab-*", JOURNAL)):
        with contextlib.suppress(OSError, ValueError), open(path) as f:
            journal = json.load(f)
            if journal["pid"] == pid:
                return journal
    return None


def _faulted(proc, log):
    """Start stack-split without a stack; wait until its fault (the lower's max_sectors_kb -> 4) is
    in the journal and return the journal: every setting changed then (a stale nomerges on a
    reused loop device too) must come back."""

    def fault():
        assert proc.poll() is None, "the scenario ended before its fault:\n" + log.read_text()
        journal = _journal(proc.pid)
        if journal and any(
            attr == "queue/max_sectors_kb" and new == "4" for _, attr, _, new in journal["changed"]
        ):
            return journal

    journal = procs.wait_until("the fault in the lab's journal", fault, 90, interval=0.2)
    dev = journal["devices"]["lower"]
    assert loop.read_sysfs(dev, "queue/max_sectors_kb") == "4"
    assert (
        subprocess.run(
            ["pgrep", "-f", f"blockstack-lab-{proc.pid}-"], capture_output=True
        ).returncode
        == 0
    ), "fio is not running"
    return journal


def _start(log):
    argv = [
        sys.executable,
        "-u",
        "-m",
        "blockstack_lab",
        "run",
        "stack-split",
        "--no-stack",
        "--warmup",
        "3",
    ]
    with open(log, "w") as out:
        return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_scenario_leaves_nothing(lab_prerequisites, signum, tmp_path):
    log = tmp_path / "lab.log"
    proc = _start(log)
    try:
        journal = _faulted(proc, log)
        proc.send_signal(signum)
        proc.wait(120)
    finally:
        if proc.poll() is None:  # the test failed midway: let the lab clean up, then make sure
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                subprocess.run(
                    [sys.executable, "-m", "blockstack_lab", "sweep"], cwd=REPO, timeout=120
                )
    assert proc.returncode == (130 if signum == signal.SIGINT else 143), log.read_text()
    problems = _leftovers(journal["dir"], f"blockstack-lab-{proc.pid}-", journal["changed"])
    assert not problems, "\n".join(problems) + "\n" + log.read_text()


def test_killed_lab_is_swept(lab_prerequisites, tmp_path):
    """SIGKILL cannot be caught: `python -m blockstack_lab sweep` undoes the lab from the journal it
    keeps in its directory (fio stopped, settings restored, unmounted, detached, removed)."""
    log = tmp_path / "lab.log"
    proc = _start(log)
    try:
        journal = _faulted(proc, log)
    finally:
        proc.kill()
        proc.wait()
        sweep = subprocess.run(
            [sys.executable, "-m", "blockstack_lab", "sweep"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert journal["dir"] in sweep.stdout, sweep.stdout
    problems = _leftovers(journal["dir"], f"blockstack-lab-{proc.pid}-", journal["changed"])
    assert not problems, "\n".join(problems) + "\n" + sweep.stdout
