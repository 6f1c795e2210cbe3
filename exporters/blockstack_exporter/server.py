"""The HTTP side: GET /metrics (and a landing page at /), nothing else.

- The exposition is prometheus_client's own (choose_encoder: text 0.0.4 or OpenMetrics, as the
  Accept header asks; gzip when accepted). Each family is encoded by the library on its own and
  its text kept until the family changes: between two scrapes most families (queue settings,
  the device stack, ext4 options, dm tables) are equal sample for sample, and the library's
  text of an equal family is the same bytes.
- Concurrent requests share the collection in flight instead of queueing their own: a burst of
  scrapes costs one collection. A request waits for it at most its own deadline (503 past it).
- The deadline of a collection is Prometheus's X-Prometheus-Scrape-Timeout-Seconds minus a
  margin (--web.scrape-timeout-offset, as blackbox_exporter's --timeout-offset), or
  --web.default-scrape-timeout without the header; the collectors share it (scrape.py).
- The connections are httpd/blockstack_http.py's (its docstring says what they get): a request
  counts only when it arrived whole, within 5 s; a connection closed in the middle of its request
  line or headers, or whose client closed before the collection would start, triggers no
  collection. 400 for a malformed request line, target or header, no HTTP/0.9. At most 1,024
  connections at once; at that number, the connection that has been sending its request the
  longest is closed to make room for a new one (Prometheus sends a request in one go; a client
  that trickles it is the one to go); a request that arrived whole is never closed for another.
"""

import gzip
import logging
import threading
import time
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder, gzip_accepted

import blockstack_http

from . import __version__

log = logging.getLogger("blockstack_exporter")

GZIP_LEVEL = 6  # zlib's and Go's default (node_exporter); the library's 9 takes 4x as long for 2 % fewer bytes
MAX_TIMEOUT_HEADER = 300.0  # a larger X-Prometheus-Scrape-Timeout-Seconds is taken as this
LANDING = (
    b"<html><head><title>blockstack-exporter</title></head><body><h1>blockstack-exporter</h1>"
    b'<p><a href="/metrics">Metrics</a></p></body></html>\n'
)


class _Families:
    """A list of families as the library's encoders take it (a collector)."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


class FamilyTextCache:
    """prometheus_client's encoder applied family by family, each family's text kept while the
    family stays equal (name, type, HELP, unit and every sample). Thread-safe. Worth 214 % of a
    1024-device scrape's CPU (make bench-exporter --without family-text)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._texts = {}  # content type -> {(name, type): ((documentation, unit, samples), bytes)}
        self.hits = 0  # families served from the kept text (test_library checks the cache works)

    def render(self, families, encoder, content_type):
        openmetrics = content_type.startswith("application/openmetrics-text")
        eof = b"# EOF\n"
        with self._lock:
            previous = self._texts.get(content_type, {})
            current, parts = {}, []
            for family in families:
                key = (family.name, family.type)
                state = (family.documentation, family.unit, family.samples)
                known = previous.get(key)
                if known is not None and known[0] == state:
                    text = known[1]
                    self.hits += 1
                else:
                    text = encoder(_Families([family]))
                    if openmetrics and text.endswith(eof):
                        text = text[: -len(eof)]
                current[key] = (state, text)
                parts.append(text)
            self._texts[content_type] = current
        if openmetrics:
            parts.append(eof)
        return b"".join(parts)


class _Flight:
    def __init__(self, deadline):
        self.deadline = deadline
        self.done = threading.Event()
        self.families = None
        self.error = None
        self.lock = threading.Lock()
        self.bodies = {}


class Exporter:
    """Collections of a registry, one in flight at a time, shared by the requests that wait."""

    def __init__(self, registry, scrape_timeout=4.5, timeout_offset=0.5):
        self.registry = registry
        self.scrape_timeout, self.timeout_offset = scrape_timeout, timeout_offset
        self.texts = FamilyTextCache()
        self._lock = threading.Lock()
        self._flight = None
        self.collections = 0

    def deadline_for(self, header):
        """Monotonic deadline of a collection for a request with this timeout header (or None)."""
        timeout = self.scrape_timeout
        if header:
            try:
                value = float(header)
                if value > 0 and value == value:
                    timeout = min(value, MAX_TIMEOUT_HEADER) - self.timeout_offset
            except ValueError:
                pass
        return time.monotonic() + max(timeout, 0.1)

    def _collect(self, flight):
        from .scrape import deadline  # set for the collectors of this thread

        with deadline(flight.deadline):
            return list(self.registry.collect())

    def families(self, deadline):
        """The families of the collection in flight, or of a new one; None past the deadline."""
        with self._lock:
            flight, leader = self._flight, False
            if flight is None:
                flight = self._flight = _Flight(deadline)
                leader = True
                self.collections += 1
        if leader:
            try:
                flight.families = self._collect(flight)
            except Exception as e:  # the collectors catch their own; this is the registry's
                log.exception("collection failed")
                flight.error = e
            finally:
                with self._lock:
                    self._flight = None
                flight.done.set()
        elif not flight.done.wait(max(0.0, deadline - time.monotonic())):
            return None, None
        return flight, flight.families

    def body(self, flight, accept):
        encoder, content_type = choose_encoder(accept)
        with flight.lock:
            if content_type not in flight.bodies:
                flight.bodies[content_type] = self.texts.render(
                    flight.families, encoder, content_type
                )
            return flight.bodies[content_type], content_type


class Handler(blockstack_http.Handler):
    server_version = f"blockstack-exporter/{__version__}"

    def log_message(self, format, *args):  # no access log (prometheus_client's server has none)
        pass

    def __getattr__(self, name):
        if name.startswith("do_"):  # any other method: 405
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self):
        self.reply(405, b"Method Not Allowed\n", headers=[("Allow", "GET")])

    def do_GET(self):
        path = urlsplit(self.path).path
        if path == "/":
            return self.reply(200, LANDING, "text/html; charset=utf-8")
        if path != "/metrics":
            return self.reply(404, b"Not Found\n")
        exporter = self.server.exporter
        deadline = exporter.deadline_for(self.headers.get("X-Prometheus-Scrape-Timeout-Seconds"))
        if self.client_gone():  # an aborted request: no collection
            return
        flight, families = exporter.families(deadline)
        if flight is None:
            return self.reply(503, b"collection in flight did not finish in time\n")
        if families is None:
            return self.reply(500, b"collection failed\n")
        body, content_type = exporter.body(flight, self.headers.get("Accept"))
        headers = []
        if gzip_accepted(self.headers.get("Accept-Encoding")):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        self.reply(200, body, content_type, headers)


class Server(blockstack_http.Server):
    def __init__(
        self,
        address,
        exporter,
        max_connections=blockstack_http.MAX_CONNECTIONS,
        request_seconds=blockstack_http.REQUEST_SECONDS,
    ):
        self.exporter = exporter
        super().__init__(address, Handler, max_connections, request_seconds)


def serve(registry, host, port, scrape_timeout, timeout_offset):
    exporter = Exporter(registry, scrape_timeout, timeout_offset)
    server = Server((host, port), exporter)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return server, thread
