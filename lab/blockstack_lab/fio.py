"""fio runs with JSON output and a hard time limit."""

import contextlib
import json
import os
import subprocess

from blockstack_testsupport import procs

from . import loop

# The incident workload: batched sequential 4 KiB direct reads. On a loop device this averages
# 256 sectors per request with nomerges=0 and 8 with nomerges=2.
SEQ_BATCHED_READ = [
    "--rw=read",
    "--bs=4k",
    "--direct=1",
    "--ioengine=libaio",
    "--iodepth=64",
    "--iodepth_batch_submit=64",
    "--iodepth_batch_complete_min=32",
]
RANDOM_4K_READ = ["--rw=randread", "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=16"]


def run(args, runtime=3, name="lab"):
    """Run fio for `runtime` seconds (time_based) and return its parsed JSON report."""
    argv = [
        "fio",
        f"--name={name}",
        "--output-format=json",
        "--time_based",
        f"--runtime={runtime}",
        *args,
    ]
    out = subprocess.run(
        argv, check=True, capture_output=True, text=True, timeout=runtime + 60
    ).stdout
    # fio may print warnings before the JSON document.
    return json.loads(out[out.index("{") :])


def iops(report, op="read"):
    return sum(job[op]["iops"] for job in report["jobs"])


@contextlib.contextmanager
def background(args, runtime=3600, name="lab", output="/dev/null"):
    """fio in the background, in its own process group (its job processes included), for at most
    `runtime` seconds; the whole group is stopped on exit. Yields the Popen."""
    argv = [
        "fio",
        f"--name={name}",
        "--time_based",
        f"--runtime={runtime}",
        f"--output={output}",
        *args,
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        yield proc
    finally:
        procs.stop(proc)


@contextlib.contextmanager
def reads_on_ext4(runtime, directory="/dev/shm"):
    """The incident workload in a filesystem: SEQ_BATCHED_READ of a 128 MiB file laid out in an
    ext4 on a loop device over a file in `directory` (tmpfs: nothing beneath the loop device, so a
    page names it alone), in the background for at most `runtime` seconds. Yields the device."""
    with loop.attached(256 << 20, directory=directory) as dev, loop.ext4(dev) as mnt:
        data = os.path.join(mnt, "data")
        subprocess.run(
            [
                "fio",
                "--name=layout",
                f"--filename={data}",
                "--size=128m",
                "--rw=write",
                "--bs=1m",
                "--direct=1",
                "--output=/dev/null",
            ],
            check=True,
            timeout=120,
        )
        with background(
            [f"--filename={data}", "--size=128m", *SEQ_BATCHED_READ], runtime=runtime, name="seq"
        ):
            yield dev
