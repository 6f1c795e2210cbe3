#!/usr/bin/env python3
"""Robustness of blockstack-exporter: a long fuzz run and HTTP abuse, figures for BENCHMARKS.md.

    make fuzz-exporter FUZZ_ARGS="[--iterations 10000] [--promtool-every 10] [--seed 1]"

It uses the exporter's test helpers (exporters/tests/fuzzing.py, exporter_testlib.py): run it
with PYTHONPATH=exporters/tests, as the make target does.

Fuzz: the real exporter over HTTP while 1-3 of the files and commands it reads are damaged per
iteration (exporters/tests/fuzzing.py: random bytes, huge, not UTF-8, hundreds or thousands of
digits, deleted, symlink loops, renamed to bytes that are not UTF-8; dmsetup printing garbage,
too much, failing or hanging). Every exposition is parsed with prometheus_client's parser,
every Nth is checked with promtool. Prints iterations, HTTP non-200 answers, failed checks,
damages not counted in blockstack_collector_errors_total, the slowest scrape, peak RSS and log
lines per scrape.

HTTP abuse, against a fresh exporter whose dmsetup takes 0.5 s: 500 concurrent scrapes, 20
aborted and 20 half-sent requests, 200 connections that never finish their request, and other
methods and paths; dmsetup's runs count the collections. A benchmark, not a test: it asserts
nothing (exporters/tests/test_fuzz.py and test_hardening.py are the tests).
"""

import argparse
import os
import random
import shutil
import tempfile
import threading
import time

from exporter_testlib import exporter_argv, full_tree, http
from fuzzing import ABORTED, HALF_SENT, SLOW, TARGETS, Fuzzer, closed_by_exporter, damaged_request

from blockstack_testsupport import procs


def fuzz(base, iterations, promtool_every, seed):
    fz = Fuzzer(base, seed)
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    with procs.running(
        fz.argv(port), env=fz.env(), health_url=url + "/", log_path=fz.log_path
    ) as proc:
        fz.calibrate(url)
        for i in range(iterations):
            fz.iteration(
                url, proc.pid, fz.choose(), promtool=promtool_every > 0 and i % promtool_every == 0
            )
            if (i + 1) % 1000 == 0:
                print(f"  {i + 1} iterations, {time.monotonic() - start:.0f} s", flush=True)
        # the same garbage scrape after scrape: what a host with a persistent problem logs
        steady = [
            (t, "huge" if t[1] in ("command", "text") else "random")
            for t in fz.rng.sample(
                [t for t in TARGETS if t[1] in ("number", "text", "info", "command")], 10
            )
        ]
        undo = [fz.damage(t, d) for t, d in steady]
        try:
            http(url + "/metrics")
            lines = fz._log_lines()
            for _ in range(20):
                http(url + "/metrics")
            steady_lines = (fz._log_lines() - lines) / 20
        finally:
            for u in reversed(undo):
                u()
    s = fz.stats
    print(f"fuzz: {s['iterations']} iterations in {time.monotonic() - start:.0f} s (seed {seed})")
    print(f"  HTTP answers other than 200:      {s['http_non_200']}")
    print(f"  expositions prometheus_client could not parse: {s['parse_failures']}")
    print(
        f"  promtool check metrics:           {s['promtool_runs']} runs, {s['promtool_failures']} failed"
    )
    print(f"  damages not counted in errors_total: {s['uncounted']}")
    print(f"  slowest scrape:                   {s['slowest']:.2f} s")
    print(f"  peak RSS (VmHWM):                 {s['peak_rss'] / 2**20:.1f} MiB")
    print(
        f"  log lines per scrape:             {s['log_lines'] / max(1, s['iterations']):.2f} "
        "(each iteration is a change: new damage, and the last one's undone)"
    )
    print(f"  log lines per scrape, the same 10 damages for 20 scrapes: {steady_lines:.2f}")
    for chosen, problems in s["failures"][:10]:
        print(f"  FAILED {chosen}: {problems}")


def abuse(base):
    tree, fixtures = full_tree(base)
    log = os.path.join(base, "dmsetup.log")
    env = {
        "FAKE_DMSETUP_FIXTURES": fixtures,
        "FAKE_DMSETUP_MODE": "hang",
        "FAKE_DMSETUP_SLEEP": "0.5",
        "FAKE_DMSETUP_LOG": log,
    }
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"

    def collections():
        """dmsetup status runs on every collection (the tree has a snapshot), the table only
        when it may have changed."""
        try:
            with open(log) as f:
                return sum(1 for line in f if line.rstrip().endswith("dmsetup status --noflush"))
        except FileNotFoundError:
            return 0

    print("HTTP abuse (dmsetup takes 0.5 s, so a collection takes >= 0.5 s):")
    with procs.running(
        exporter_argv(tree, port),
        env=env,
        health_url=url + "/",
        log_path=os.path.join(base, "exporter.log"),
    ):
        # 500 concurrent scrapes
        before, results = collections(), []
        lock = threading.Lock()

        def scrape():
            try:
                r = http(url + "/metrics", timeout=60)
            except OSError as e:
                r = (type(e).__name__, "", 0)
            with lock:
                results.append((r[0], time.monotonic()))

        threads = [threading.Thread(target=scrape) for _ in range(500)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        ok = sum(1 for r in results if r[0] == 200)
        last = max(t for _, t in results) - start
        print(
            f"  500 concurrent scrapes: {ok} answered 200, {len(results) - ok} refused or failed, "
            f"last answer after {last:.1f} s, {collections() - before} collections"
        )

        # aborted and half-sent requests
        before = collections()
        for _ in range(20):
            damaged_request(url, ABORTED)
            damaged_request(url, HALF_SENT)
        time.sleep(2)
        print(f"  20 aborted + 20 half-sent requests: {collections() - before} collections")

        # 200 connections that never finish their request, then a real scrape
        slow = [damaged_request(url, SLOW, keep_open=True) for _ in range(200)]
        before = collections()
        status, _, seconds = http(url + "/metrics")
        print(
            f"  a scrape while 200 connections never finish their request: HTTP {status} in {seconds:.2f} s, "
            f"{collections() - before} collection"
        )
        time.sleep(6.5)
        print(
            f"  ... of the 200, closed by the exporter within 6.5 s: {closed_by_exporter(slow, 0.5)}"
        )

        # other methods and paths
        before = collections()
        answers = {}
        for method, path in (
            ("POST", "/metrics"),
            ("PUT", "/metrics"),
            ("DELETE", "/"),
            ("HEAD", "/metrics"),
            ("GET", "/favicon.ico"),
            ("GET", "/metrics/../x"),
            ("GET", "/"),
        ):
            answers[f"{method} {path}"] = http(url + path, method=method)[0]
        print(f"  other methods and paths: {answers}, {collections() - before} collections")


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--iterations", type=int, default=10000)
    p.add_argument("--promtool-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-abuse", action="store_true")
    args = p.parse_args()
    base = tempfile.mkdtemp(prefix="blockstack-fuzz-")
    try:
        if not args.no_abuse:
            abuse(os.path.join(base, "abuse"))
        fuzz(os.path.join(base, "fuzz"), args.iterations, args.promtool_every, args.seed)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    random.seed(0)
    main()
