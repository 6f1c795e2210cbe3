"""blockstack-exporter command line: flags in node_exporter's style, listens on 127.0.0.1."""

import argparse
import logging
import os
import sys
import threading

from prometheus_client import ProcessCollector
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from . import __version__, checks, collectors, knobs, server
from .collectors import ALL
from .scrape import BlockstackCollector, Paths, add_dm_flags, add_path_flags

DEFAULT_LISTEN = "127.0.0.1:9363"


def build_registry(args):
    registry = CollectorRegistry(auto_describe=False)
    enabled = collectors.build(
        args.collectors,
        knobs.load(args.knobs, checks.KNOBS) if "findings" in args.collectors else None,
        dmsetup=args.dmsetup,
        dm_timeout=args.dmsetup_timeout,
        dm_helper=args.dm_helper,
        ebpf_status=args.ebpf_status_file,
        dev=args.dev,
    )
    registry.register(BlockstackCollector(enabled, Paths(args.sysfs, args.procfs, args.dev)))
    registry.register(_BuildInfo())
    # process_* of the exporter itself (the real /proc, not --path.procfs): its open descriptors
    # (sysfs attributes are kept open between scrapes), RSS and CPU.
    _ProcessCollector(registry=registry)
    return registry


class _ProcessCollector(ProcessCollector):
    """prometheus_client's process_* metrics, with process_open_fds counted by one stat(2) of
    /proc/self/fd: since Linux 6.2 its size is the number of open descriptors, where the library
    lists the directory (~7,000 kept sysfs descriptors with 1,000 devices: a tenth of a scrape).
    Where the size is 0 (older kernels) the library's listing is used."""

    def collect(self):
        try:
            count = os.stat("/proc/self/fd").st_size
        except OSError:
            count = 0
        if not count:
            return super().collect()
        families = []
        try:
            with open("/proc/self/stat", "rb") as f:
                parts = f.read().split(b")")[-1].split()
            families += [
                GaugeMetricFamily(
                    "process_virtual_memory_bytes",
                    "Virtual memory size in bytes.",
                    value=float(parts[20]),
                ),
                GaugeMetricFamily(
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes.",
                    value=float(parts[21]) * self._pagesize,
                ),
                GaugeMetricFamily(
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    value=float(parts[19]) / self._ticks + self._btime,
                ),
                CounterMetricFamily(
                    "process_cpu_seconds_total",
                    "Total user and system CPU time spent in seconds.",
                    value=(float(parts[11]) + float(parts[12])) / self._ticks,
                ),
            ]
        except (OSError, IndexError, ValueError):
            pass
        families.append(
            GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", value=count)
        )
        try:
            with open("/proc/self/limits", "rb") as f:
                for line in f:
                    if line.startswith(b"Max open file"):
                        families.append(
                            GaugeMetricFamily(
                                "process_max_fds",
                                "Maximum number of open file descriptors.",
                                value=float(line.split()[3]),
                            )
                        )
                        break
        except (OSError, IndexError, ValueError):
            pass
        return families


class _BuildInfo(Collector):
    def collect(self):
        g = GaugeMetricFamily(
            "blockstack_exporter_build_info",
            "The exporter's version (value always 1).",
            labels=["version"],
        )
        g.add_metric([__version__], 1)
        yield g


def parse_args(argv):
    p = argparse.ArgumentParser(prog="blockstack-exporter", description=__doc__, allow_abbrev=False)
    p.add_argument(
        "--web.listen-address",
        dest="listen",
        default=DEFAULT_LISTEN,
        help="host:port to serve /metrics on (default %(default)s; loopback only unless you say so)",
    )
    add_path_flags(p)
    for name in ALL:  # node_exporter's --collector.NAME / --no-collector.NAME
        p.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"enable the {name} collector (default: enabled)",
        )
    p.add_argument(
        "--collector.disable-defaults",
        dest="disable_defaults",
        action="store_true",
        help="disable every collector not enabled by its own --collector.NAME flag",
    )
    add_dm_flags(p, timeout=5.0)
    p.add_argument(
        "--collector.dm.helper",
        dest="dm_helper",
        default=None,
        metavar="SOCKET",
        help="ask the dm helper on this Unix socket (python -m blockstack_exporter.dm_helper) for the "
        "device-mapper tables and status instead of running dmsetup (default: run dmsetup)",
    )
    p.add_argument(
        "--collector.ebpf.status-file",
        dest="ebpf_status_file",
        default=None,
        metavar="PATH",
        help="ebpf-configs/select-configs.sh's status file: which sets of BPF programs load on this "
        "kernel, and why the others do not (default: none, nothing published)",
    )
    p.add_argument(
        "--config.knobs",
        dest="knobs",
        default=None,
        metavar="PATH",
        help="the alerts' config.yml whose thresholds the findings use (default: the copy shipped "
        "with the exporter, the repository's alerts/config.yml)",
    )
    p.add_argument(
        "--web.default-scrape-timeout",
        dest="scrape_timeout",
        type=float,
        default=4.5,
        help="seconds a collection may take when the request has no X-Prometheus-Scrape-Timeout-Seconds "
        "header (default %(default)s: the stack scrapes every 5 s with a 5 s timeout)",
    )
    p.add_argument(
        "--web.scrape-timeout-offset",
        dest="timeout_offset",
        type=float,
        default=0.5,
        help="seconds subtracted from X-Prometheus-Scrape-Timeout-Seconds for the answer to arrive in "
        "time (default %(default)s)",
    )
    p.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=["debug", "info", "warning", "error"],
    )
    p.add_argument("--version", action="version", version=__version__)
    args = p.parse_args(argv)
    args.collectors = [
        name
        for name in ALL
        if (
            getattr(args, f"collector_{name}")
            if getattr(args, f"collector_{name}") is not None
            else not args.disable_defaults
        )
    ]
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    host, _, port = args.listen.rpartition(":")
    try:
        registry = build_registry(args)
    except knobs.KnobsError as e:
        sys.exit(f"blockstack-exporter: --config.knobs: {e}")
    httpd, _ = server.serve(
        registry,
        host.strip("[]") or "127.0.0.1",
        int(port),
        args.scrape_timeout,
        args.timeout_offset,
    )
    logging.getLogger("blockstack_exporter").info(
        "listening on %s, collectors %s", args.listen, ",".join(args.collectors)
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.shutdown()


if __name__ == "__main__":
    main()
