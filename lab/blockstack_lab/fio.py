"""fio runs with JSON output and a hard time limit."""
import contextlib
import json
import subprocess

from blockstack_deploy import procs

# The incident workload: batched sequential 4 KiB direct reads. On a loop device this averages
# 256 sectors per request with nomerges=0 and 8 with nomerges=2.
SEQ_BATCHED_READ = ["--rw=read", "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=64",
                    "--iodepth_batch_submit=64", "--iodepth_batch_complete_min=32"]
RANDOM_4K_READ = ["--rw=randread", "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=16"]


def run(args, runtime=3, timeout=None, name="lab"):
    """Run fio for `runtime` seconds (time_based) and return its parsed JSON report."""
    argv = ["fio", f"--name={name}", "--output-format=json", "--time_based", f"--runtime={runtime}",
            *args]
    out = subprocess.run(argv, check=True, capture_output=True, text=True,
                         timeout=timeout or runtime + 60).stdout
    # fio may print warnings before the JSON document.
    return json.loads(out[out.index("{"):])


def iops(report, op="read"):
    return sum(job[op]["iops"] for job in report["jobs"])



@contextlib.contextmanager
def background(args, runtime=3600, name="lab", output="/dev/null"):
    """fio in the background, in its own process group (its job processes included), for at most
    `runtime` seconds; the whole group is stopped on exit. Yields the Popen."""
    argv = ["fio", f"--name={name}", "--time_based", f"--runtime={runtime}", f"--output={output}", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        procs.stop(proc)
