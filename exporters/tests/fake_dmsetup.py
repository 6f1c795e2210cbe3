#!/usr/bin/env python3
"""Stand-in for dmsetup, used only by tests (`DmCollector(dmsetup=...)`, `--collector.dm.dmsetup`).

Prints the fixture named after its command line, like node-exporter-textfile-collector-scripts
mock/fixtures/: `fake_dmsetup.py status --noflush` prints $FAKE_DMSETUP_FIXTURES/dmsetup_status_--noflush.

Environment:
  FAKE_DMSETUP_FIXTURES  directory holding the fixtures (required)
  FAKE_DMSETUP_MODE      ok (default) | fail (stderr + exit 1, as dmsetup without /dev/mapper/control)
                         | hang (sleep FAKE_DMSETUP_SLEEP seconds, default 60, then print)
                         | absent (exit 127, as a shell reports a missing command)
  FAKE_DMSETUP_ONLY      apply MODE only to this subcommand (e.g. "status"); others behave normally
  FAKE_DMSETUP_LOG       append "PID dmsetup ARGS..." per call to this file (tests count the calls
                         and check a hung one was killed)
A file `mode` in the fixtures directory, "MODE [SUBCOMMAND]", overrides MODE and ONLY (the fuzz
test changes it while the exporter runs).
"""
import os
import sys
import time


def main(argv):
    command = "_".join(["dmsetup", *argv])
    log = os.environ.get("FAKE_DMSETUP_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} " + " ".join(["dmsetup", *argv]) + "\n")
    mode = os.environ.get("FAKE_DMSETUP_MODE", "ok")
    only = os.environ.get("FAKE_DMSETUP_ONLY")
    try:
        with open(os.path.join(os.environ.get("FAKE_DMSETUP_FIXTURES", ""), "mode")) as f:
            mode, _, only = f.read().strip().partition(" ")
    except OSError:
        pass
    if only and (not argv or argv[0] != only):
        mode = "ok"
    if mode == "absent":
        sys.stderr.write("sh: 1: dmsetup: not found\n")
        return 127
    if mode == "fail":
        sys.stderr.write("/dev/mapper/control: open failed: Permission denied\n"
                         "Failure to communicate with kernel device-mapper driver.\n"
                         "Command failed.\n")
        return 1
    if mode == "hang":
        time.sleep(float(os.environ.get("FAKE_DMSETUP_SLEEP", "60")))
    directory = os.environ.get("FAKE_DMSETUP_FIXTURES")
    if not directory:
        sys.stderr.write("fake_dmsetup: FAKE_DMSETUP_FIXTURES is not set\n")
        return 2
    try:
        with open(os.path.join(directory, command), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        sys.stderr.write(f"fake_dmsetup: no fixture {command} in {directory}\nCommand failed.\n")
        return 1
    sys.stdout.buffer.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
