"""The lab leaves the machine as it found it when it is interrupted midway: a scenario in a
subprocess gets SIGINT (Ctrl-C) or SIGTERM after it has changed a sysfs setting, and afterwards
no loop device over its files, no mount, no fio of its own and no changed setting remain."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from blockstack_lab import loop
from blockstack_deploy.stack import REPO

pytestmark = [pytest.mark.root]


def _leftovers(lab_dir, tag, changed):
    problems = []
    if lab_dir and os.path.exists(lab_dir):
        problems.append(f"lab directory {lab_dir} still exists")
    for dev, back in loop.attached_devices().items():
        if lab_dir and back.startswith(lab_dir):
            problems.append(f"{dev} still attached over {back}")
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f]
    problems += [f"still mounted: {m}" for m in mounts if lab_dir and m.startswith(lab_dir)]
    fios = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    problems += [f"fio still running: pid {p}" for p in fios]
    for dev, attr, old in changed:
        now = loop.read_sysfs(dev, attr)
        if now != old:
            problems.append(f"{dev} {attr} is {now}, was {old}")
    return problems


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_scenario_leaves_nothing(lab_prerequisites, signum):
    argv = [sys.executable, "-u", "-m", "blockstack_lab", "run", "stack-split", "--no-stack", "--warmup", "3"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tag = f"blockstack-lab-{proc.pid}-"
    out, lab_dir, changed, fault = [], None, [], None
    deadline = time.monotonic() + 90
    try:
        # read the narration until the fault is injected (a setting changed, fio running)
        for line in proc.stdout:
            out.append(line)
            m = re.search(r"all backed by (\S+)", line)
            if m:
                lab_dir = m.group(1)
            # every setting the lab changes (a stale nomerges on a reused loop device too) must
            # come back; the fault itself is max_sectors_kb -> 4 on the lower device
            m = re.search(r"set (loop\d+) (\S+) (\S+) -> (\S+)", line)
            if m:
                changed.append(("/dev/" + m.group(1), m.group(2), m.group(3)))
                if m.group(2) == "queue/max_sectors_kb" and m.group(4) == "4":
                    fault = changed[-1]
                    break
            assert time.monotonic() < deadline, "no setting changed within 90 s:\n" + "".join(out)
        assert fault, "the scenario ended before its fault:\n" + "".join(out)
        assert subprocess.run(["pgrep", "-f", tag], capture_output=True).returncode == 0, "fio is not running"
        assert loop.read_sysfs(*fault[:2]) == "4"
        time.sleep(2)
        proc.send_signal(signum)
        rest, _ = proc.communicate(timeout=120)
        out.append(rest)
    finally:
        if proc.poll() is None:  # the test failed midway: let the lab clean up, then make sure
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                subprocess.run([sys.executable, "-m", "blockstack_lab", "sweep"], cwd=REPO, timeout=120)
    text = "".join(out)
    assert proc.returncode == (130 if signum == signal.SIGINT else 143), text
    assert "restored" in text, text
    problems = _leftovers(lab_dir, tag, changed)
    assert not problems, "\n".join(problems) + "\n" + text


def test_killed_lab_is_swept(lab_prerequisites):
    """SIGKILL cannot be caught: `python -m blockstack_lab sweep` undoes the lab from the journal it
    keeps in its directory (fio stopped, settings restored, unmounted, detached, removed)."""
    argv = [sys.executable, "-u", "-m", "blockstack_lab", "run", "stack-split", "--no-stack", "--warmup", "3"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tag = f"blockstack-lab-{proc.pid}-"
    out, lab_dir, changed, fault = [], None, [], None
    try:
        for line in proc.stdout:
            out.append(line)
            m = re.search(r"all backed by (\S+)", line)
            if m:
                lab_dir = m.group(1)
            m = re.search(r"set (loop\d+) (\S+) (\S+) -> (\S+)", line)
            if m:
                changed.append(("/dev/" + m.group(1), m.group(2), m.group(3)))
                if m.group(2) == "queue/max_sectors_kb" and m.group(4) == "4":
                    fault = changed[-1]
                    break
        assert fault, "the scenario ended before its fault:\n" + "".join(out)
    finally:
        proc.kill()
        proc.wait()
        sweep = subprocess.run([sys.executable, "-m", "blockstack_lab", "sweep"], cwd=REPO, capture_output=True,
                               text=True, timeout=120)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert lab_dir in sweep.stdout, sweep.stdout
    problems = _leftovers(lab_dir, tag, changed)
    assert not problems, "\n".join(problems) + "\n" + sweep.stdout
