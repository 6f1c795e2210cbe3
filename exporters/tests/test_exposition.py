"""The leaner encoder writes what prometheus_client's encoders write, byte for byte, in both
formats; the app answers like prometheus_client's make_wsgi_app."""
import gzip

from hypothesis import given, strategies as st
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    InfoMetricFamily)
from prometheus_client.openmetrics.exposition import generate_latest as generate_latest_openmetrics

from blockstack_exporter.exposition import Collected, make_app, render
from exporter_testlib import HOST_LOOP, registry_for


def assert_same_as_prometheus_client(families):
    reference = Collected(families)
    assert render(families).decode() == generate_latest(reference).decode()
    assert render(families, openmetrics=True).decode() == generate_latest_openmetrics(reference).decode()


def test_fixture_scrape():
    assert_same_as_prometheus_client(list(registry_for(HOST_LOOP).collect()))


def test_escapes_empty_families_and_help_text():
    g = GaugeMetricFamily("a_gauge", 'Help with a "quote", a \\ and a\nnewline.', labels=["path", "z", "b"])
    g.add_metric(['/srv/my "odd"\\dir\nx', "", "ü"], 1)
    g.add_metric(["plain", 'only "quotes"', "only \\ a backslash"], 2.5)
    g.add_metric(["only a\nnewline", "1", "2"], 0.25)
    c = CounterMetricFamily("a_counter", "A counter.", labels=["device"])
    c.add_metric(["sda"], 7)
    empty = GaugeMetricFamily("no_samples", "Nothing to report.", labels=["device"])
    unlabelled = GaugeMetricFamily("unlabelled", "No labels.", value=3)
    assert_same_as_prometheus_client([g, c, empty, unlabelled])


values = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0, -0.0, 1e-7, 123456789, 1234567.0, True]))


label_values = st.text(alphabet=st.sampled_from('a-"\\\n ü/'), max_size=12) | st.text(max_size=12)


@given(st.lists(st.tuples(label_values, values), max_size=8), st.booleans())
def test_any_label_value_and_number(samples, counter):
    family = (CounterMetricFamily if counter else GaugeMetricFamily)("x", "X.", labels=["l"])
    for label, value in samples:
        family.add_metric([label], value)
    assert_same_as_prometheus_client([family])


def test_what_it_does_not_write_goes_to_prometheus_client():
    created = CounterMetricFamily("with_created", "A counter with _created.", labels=["l"])
    created.add_metric(["a"], 1, created=1700000000.5)
    stamped = GaugeMetricFamily("stamped", "A sample with a timestamp.", labels=["l"])
    stamped.add_metric(["a"], 1, timestamp=1700000000)
    histogram = HistogramMetricFamily("h", "A histogram.", buckets=[("1.0", 1), ("+Inf", 2)], sum_value=3)
    info = InfoMetricFamily("i", "An info.", value={"version": "1"})
    with_unit = GaugeMetricFamily("size_bytes", "A unit.", value=1, unit="bytes")
    gauge = GaugeMetricFamily("plain", "A gauge.", value=1)
    for odd in (created, stamped, histogram, info, with_unit):
        assert_same_as_prometheus_client([gauge, odd])


def wsgi_get(app, path="/metrics", query="", **headers):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query}
    environ.update({"HTTP_" + k.upper(): v for k, v in headers.items()})
    answer = {}

    def start_response(status, response_headers):
        answer["status"], answer["headers"] = status, dict(response_headers)

    body = b"".join(app(environ, start_response))
    if answer["headers"].get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return answer["status"], answer["headers"], body


def test_app_answers_like_prometheus_client():
    g = GaugeMetricFamily("blockstack_queue_nomerges", "Merging.", labels=["device"])
    g.add_metric(["sda"], 2)
    c = CounterMetricFamily("blockstack_collector_errors", "Errors.", labels=["collector"])
    c.add_metric(["queue"], 1)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(Collected([g, c]))
    ours, theirs = make_app(registry), make_wsgi_app(registry)
    prometheus = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                  "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    for headers in ({}, {"accept": prometheus}, {"accept": prometheus, "accept_encoding": "gzip"},
                    {"accept_encoding": "deflate, gzip;q=0.9"}):
        assert wsgi_get(ours, **headers) == wsgi_get(theirs, **headers)
    query = "name[]=blockstack_queue_nomerges"
    assert wsgi_get(ours, query=query) == wsgi_get(theirs, query=query)
    assert b"errors" not in wsgi_get(ours, query=query)[2]
    assert wsgi_get(ours, path="/favicon.ico") == wsgi_get(theirs, path="/favicon.ico")
