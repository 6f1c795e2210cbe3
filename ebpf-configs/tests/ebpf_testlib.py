"""Helpers for the ebpf_exporter config tests: paths, config checks, scrapes and diskstats.

The configs must be built first (`make ebpf-build`, which `make test` and `make test-ebpf` run):
ebpf_exporter in BUILD/bin, every NAME.bpf.o + NAME.yaml in BUILD/ebpf-configs.
"""

import contextlib
import os
import re
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from blockstack_testsupport import procs

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS_SRC = os.path.dirname(HERE)
ROOT = os.path.dirname(CONFIGS_SRC)
BUILD = os.environ.get("BUILD", os.path.join(ROOT, ".build"))
EXPORTER = os.path.join(BUILD, "bin", "ebpf_exporter")
CONFIG_DIR = os.path.join(BUILD, "ebpf-configs")
SELECT = os.path.join(CONFIGS_SRC, "select-configs.sh")
CANNOT_LOAD = os.path.join(CONFIGS_SRC, "cannot-load.txt")

# Without it the exporter's OpenTelemetry SDK tries localhost:4318 and exits 1 on SIGTERM.
EXPORTER_ENV = {"OTEL_TRACES_EXPORTER": "none"}


def flush_period():
    """block_io's FLUSH_NS in seconds: its histograms reach the exported maps within it of an I/O."""
    with open(os.path.join(CONFIGS_SRC, "block_batched.bpf.h")) as f:
        return int(re.search(r"^#define FLUSH_NS (\d+)ULL$", f.read(), re.M).group(1)) / 1e9


FLUSH_PERIOD = flush_period()
# What a scrape may lag behind the flush tick: the exporter reading the maps, the test's own
# scheduling on a loaded machine.
FLUSH_MARGIN = 0.1


def settle():
    """Waits until every histogram observation of I/O that has finished is in the exported maps
    (block_io flushes each CPU's pending counts FLUSH_PERIOD after its first one), with every CPU
    kept running meanwhile: this machine's hypervisor delivers an idle vCPU's timer only once the
    vCPU runs again (2026-11-26: a cpu-clock perf event on an idle CPU 1 gave 0 samples in 4 s, and 2
    a second as soon as a process ran there), so an idle CPU's last reads would wait for its next
    task, not for the flush."""
    spin = f"import time\nend = time.monotonic() + {FLUSH_PERIOD + FLUSH_MARGIN}\nwhile time.monotonic() < end: pass"
    spinners = [
        subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", spin])
        for cpu in sorted(os.sched_getaffinity(0))
    ]
    for spinner in spinners:
        spinner.wait(timeout=30)


def config_names():
    """Every config in the source tree, from its NAME.yaml."""
    return sorted(f[: -len(".yaml")] for f in os.listdir(CONFIGS_SRC) if f.endswith(".yaml"))


def cannot_load():
    """{name: (the error its failure must report, reason)} from cannot-load.txt."""
    entries = {}
    with open(CANNOT_LOAD) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                m = re.fullmatch(r"(\S+)\s+\[([^\]]+)\]\s+(.*)", line)
                if not m:
                    raise ValueError(f"cannot-load.txt: expected NAME [ERROR] REASON, got {line!r}")
                entries[m.group(1)] = (m.group(2), m.group(3))
    return entries


def config_check(names, timeout=60):
    """Run the real exporter's --config.check --config.strict; returns CompletedProcess."""
    argv = [
        EXPORTER,
        f"--config.dir={CONFIG_DIR}",
        f"--config.names={names}",
        "--config.check",
        "--config.strict",
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **EXPORTER_ENV)
    )


def selected_configs():
    out = subprocess.run(
        [SELECT, EXPORTER, CONFIG_DIR], check=True, capture_output=True, text=True, timeout=300
    )
    return out.stdout.strip()


# --- Prometheus text format ---------------------------------------------------------------------
class Scrape:
    """Samples of one scrape: {(name, frozenset(labels.items())): value}."""

    def __init__(self, text):
        self.text = text
        self.samples = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def value(self, name, **labels):
        """Sum of the samples of `name` whose labels include `labels` (0 if none)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def label_values(self, name, label):
        return {dict(ls).get(label) for (n, ls) in self.samples if n == name}

    def series(self, name):
        return [(dict(ls), v) for (n, ls), v in self.samples.items() if n == name]


class Exporter:
    def __init__(self, url):
        self.url = url

    def scrape(self):
        return Scrape(procs.http_get(self.url, timeout=10))


@contextlib.contextmanager
def running_exporter(names, log_path):
    """The real ebpf_exporter with the configs `names` on a free loopback port; stopped (process
    group killed, programs detached) on leaving."""
    port = procs.free_port()
    argv = [
        EXPORTER,
        f"--config.dir={CONFIG_DIR}",
        f"--config.names={names}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    url = f"http://127.0.0.1:{port}/metrics"
    with procs.running(argv, env=EXPORTER_ENV, health_url=url, log_path=str(log_path), timeout=60):
        yield Exporter(url)


# --- /proc/diskstats ----------------------------------------------------------------------------
def diskstats(device):
    """Fields of /proc/diskstats for one device (Documentation/admin-guide/iostats.rst):
    reads/writes completed, sectors read/written, merges."""
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if fields[2] == device:
                v = [int(x) for x in fields[3:]]
                return {
                    "reads": v[0],
                    "read_merges": v[1],
                    "read_sectors": v[2],
                    "writes": v[4],
                    "write_merges": v[5],
                    "write_sectors": v[6],
                }
    raise KeyError(device)


def delta(after, before):
    return {k: after[k] - before[k] for k in after}
