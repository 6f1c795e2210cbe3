"""blockstack-exporter command line: flags in node_exporter's style, listens on 127.0.0.1."""
import argparse
import logging
import sys
import threading

from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.registry import Collector

from . import __version__, exposition
from .collectors import ALL, DmCollector
from .scrape import BlockstackCollector, Paths

DEFAULT_LISTEN = "127.0.0.1:9363"


def build_registry(args):
    collectors = []
    for name in args.collectors:
        if name == "dm":
            collectors.append(DmCollector(dmsetup=args.dmsetup, timeout=args.dmsetup_timeout))
        else:
            collectors.append(ALL[name]())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BlockstackCollector(collectors, Paths(args.sysfs, args.procfs, args.dev)))
    registry.register(_BuildInfo())
    return registry


class _BuildInfo(Collector):
    def collect(self):
        g = GaugeMetricFamily("blockstack_exporter_build_info", "The exporter's version (value always 1).",
                              labels=["version"])
        g.add_metric([__version__], 1)
        yield g


def parse_args(argv):
    p = argparse.ArgumentParser(prog="blockstack-exporter", description=__doc__)
    p.add_argument("--web.listen-address", dest="listen", default=DEFAULT_LISTEN,
                   help="host:port to serve /metrics on (default %(default)s; loopback only unless you say so)")
    p.add_argument("--path.sysfs", dest="sysfs", default="/sys", help="sysfs mountpoint (default %(default)s)")
    p.add_argument("--path.procfs", dest="procfs", default="/proc", help="procfs mountpoint (default %(default)s)")
    p.add_argument("--path.dev", dest="dev", default="/dev",
                   help="device nodes, read for ext4 superblocks (default %(default)s)")
    p.add_argument("--collectors", default=",".join(ALL), type=lambda s: [c for c in s.split(",") if c],
                   help="comma-separated collectors to run (default %(default)s)")
    p.add_argument("--collector.dm.dmsetup", dest="dmsetup", default="dmsetup",
                   help="dmsetup binary (default %(default)s)")
    p.add_argument("--collector.dm.timeout", dest="dmsetup_timeout", type=float, default=5.0,
                   help="seconds before a dmsetup call is abandoned (default %(default)s)")
    p.add_argument("--log.level", dest="log_level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--version", action="version", version=__version__)
    args = p.parse_args(argv)
    unknown = [c for c in args.collectors if c not in ALL]
    if unknown:
        p.error(f"unknown collectors {unknown}; known: {', '.join(ALL)}")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = args.listen.rpartition(":")
    registry = build_registry(args)
    server, thread = start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1", registry=registry)
    # start_http_server takes no encoder: keep its server (address family, a thread per request,
    # no request log) and swap in the same app with the leaner encoder.
    server.set_app(exposition.make_app(registry))
    logging.getLogger("blockstack_exporter").info("listening on %s, collectors %s", args.listen, ",".join(args.collectors))
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
