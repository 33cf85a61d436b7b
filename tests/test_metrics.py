"""streamdedup.ops.metrics: our registry (prometheus_client, standard collectors), the probes, the HTTP server.

The library renders the exposition and its parser reads it back here (also in the
worker's tests); a real Prometheus reads it in test_prometheus.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from prometheus_client import Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streamdedup import config as config_module
from streamdedup.engine.engine import Engine
from streamdedup.ops.metrics import MetricsServer, new_registry, parse_address
from streamdedup.ops.telemetry import METRIC_NAMES, WorkerTelemetry

# --- reading an exposition -----------------------------------------------------------------------------

def parse_exposition(text: str) -> dict[str, dict]:
    """Families by the name a query uses (counters with ``_total``): ``{"help", "type", "samples"}``.

    Read with the library's own parser, which raises on text that is not well formed.
    """
    families: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        assert name not in families, f"family {name} twice"
        families[name] = {"help": family.documentation, "type": family.type,
                          "samples": [(s.name, s.labels, s.value) for s in family.samples]}
    return families


def value_of(families: dict, family: str, name: str | None = None, **labels: str) -> float:
    found = [v for n, l, v in families[family]["samples"] if n == (name or family) and l == labels]
    assert len(found) == 1, f"{name or family}{labels} not found once in {families[family]['samples']}"
    return found[0]


def scrape(registry) -> dict[str, dict]:
    return parse_exposition(generate_latest(registry).decode("utf-8"))


# --- the registry -----------------------------------------------------------------------------------------

STANDARD = ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds",
            "process_start_time_seconds", "python_info", "python_gc_collections_total")


def test_our_registry_has_the_standard_collectors():
    families = scrape(new_registry())
    assert set(STANDARD) <= set(families)
    assert value_of(families, "process_resident_memory_bytes") > 1 << 20
    assert value_of(families, "process_open_fds") >= 3
    assert [labels["implementation"] for _, labels, _ in families["python_info"]["samples"]] == ["CPython"]


def test_registries_are_separate_and_not_the_global_one():
    from prometheus_client import REGISTRY

    first, second = new_registry(), new_registry()
    Counter("streamdedup_documents_total", "Docs.", ("outcome",), registry=first).labels(outcome="kept").inc(3)
    Counter("streamdedup_documents_total", "Docs.", ("outcome",), registry=second).labels(outcome="kept").inc(5)
    assert value_of(scrape(first), "streamdedup_documents_total", outcome="kept") == 3
    assert value_of(scrape(second), "streamdedup_documents_total", outcome="kept") == 5
    assert "streamdedup_documents_total" not in scrape(REGISTRY)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Gauge("streamdedup_documents_total", "Again.", registry=first)


@pytest.fixture
def telemetry(tmp_path):
    with Engine(config_module.load(None, environ={}), str(tmp_path)) as engine:
        yield WorkerTelemetry(engine.index, None)


def test_two_workers_in_one_process_keep_their_own_metrics(tmp_path, telemetry):
    with Engine(config_module.load(None, environ={}), str(tmp_path / "other")) as engine:
        other = WorkerTelemetry(engine.index, None)
        telemetry.documents.labels(outcome="kept").inc(2)
        other.documents.labels(outcome="kept").inc(7)
        assert value_of(scrape(telemetry.registry), "streamdedup_documents_total", outcome="kept") == 2
        assert value_of(scrape(other.registry), "streamdedup_documents_total", outcome="kept") == 7


def test_the_worker_exposition_lists_every_documented_metric(telemetry):
    telemetry.refresh_index()
    telemetry.documents.labels(outcome="kept").inc()
    telemetry.rejected.labels(reason="invalid_json").inc()
    telemetry.lag.labels(topic="raw", partition="0").set(4)
    telemetry.batch_seconds.observe(0.3)
    families = scrape(telemetry.registry)
    assert set(METRIC_NAMES) | set(STANDARD) <= set(families)
    assert families["streamdedup_batch_duration_seconds"]["type"] == "histogram"
    assert value_of(families, "streamdedup_batch_duration_seconds", "streamdedup_batch_duration_seconds_bucket",
                    le="0.5") == 1
    assert value_of(families, "streamdedup_consumer_lag_records", topic="raw", partition="0") == 4
    assert value_of(families, "streamdedup_index_map_limit_bytes") == telemetry.index.settings.max_map_size
    assert value_of(families, "streamdedup_ready") == 0  # no partitions assigned yet
    telemetry.assigned = True
    assert value_of(scrape(telemetry.registry), "streamdedup_ready") == 1


def test_commit_age_is_computed_at_scrape(tmp_path):
    now = [1000.0]
    with Engine(config_module.load(None, environ={}), str(tmp_path)) as engine:
        telemetry = WorkerTelemetry(engine.index, None, clock=lambda: now[0])
        now[0] += 12
        assert value_of(scrape(telemetry.registry), "streamdedup_last_commit_age_seconds") == 12
        telemetry.batch_done([], 0.1)
        now[0] += 3
        assert value_of(scrape(telemetry.registry), "streamdedup_last_commit_age_seconds") == 3


@pytest.mark.parametrize("address, expected", [("127.0.0.1:9464", ("127.0.0.1", 9464)),
                                               ("localhost:0", ("localhost", 0)),
                                               (":9464", ("", 9464)),
                                               ("[::1]:9464", ("::1", 9464)),
                                               ("[::]:80", ("::", 80))])
def test_parse_address(address, expected):
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["9464", "127.0.0.1", "127.0.0.1:", "host:port", "127.0.0.1:70000",
                                     "::1:9464", "[::1]", "a b:1", ""])
def test_parse_address_rejects(address):
    with pytest.raises(ValueError, match="host:port"):
        parse_address(address)


# --- HTTP -----------------------------------------------------------------------------------------------

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def fetch(url: str, headers: dict | None = None) -> tuple[int, str, str]:
    try:
        with _OPENER.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read().decode("utf-8")


@pytest.fixture
def probes():
    return {"ready": (True, "consuming"), "healthy": (True, "ok")}


@pytest.fixture
def server(probes):
    reg = new_registry()
    Counter("streamdedup_documents_total", "Docs.", ("outcome",), registry=reg).labels(outcome="kept").inc(3)

    def check(name):
        def call():
            result = probes[name]
            if isinstance(result, Exception):
                raise result
            return result
        return call

    srv = MetricsServer(reg, "127.0.0.1:0", ready=check("ready"), healthy=check("healthy"))
    srv.start()
    yield srv
    srv.stop()


def test_http_metrics(server):
    assert server.port > 0
    status, content_type, body = fetch(f"http://127.0.0.1:{server.port}/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=")
    assert value_of(parse_exposition(body), "streamdedup_documents_total", outcome="kept") == 3
    assert "process_resident_memory_bytes" in body
    status, _, body = fetch(f"http://127.0.0.1:{server.port}/metrics?name[]=streamdedup_documents_total")
    assert status == 200 and "streamdedup_documents_total" in body and "process_" not in body


def test_http_metrics_in_openmetrics_on_request(server):
    status, content_type, body = fetch(f"http://127.0.0.1:{server.port}/metrics",
                                       {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and content_type.startswith("application/openmetrics-text")
    assert 'streamdedup_documents_total{outcome="kept"} 3.0' in body and body.endswith("# EOF\n")


def test_http_probes(server, probes):
    base = f"http://127.0.0.1:{server.port}"
    assert fetch(base + "/healthz")[::2] == (200, "ok\n")
    assert fetch(base + "/readyz")[::2] == (200, "consuming\n")
    probes["ready"] = (False, "catching up: lag 5000")
    assert fetch(base + "/readyz")[::2] == (503, "catching up: lag 5000\n")
    assert fetch(base + "/healthz")[0] == 200
    probes["healthy"] = RuntimeError("index closed")
    assert fetch(base + "/healthz")[::2] == (503, "RuntimeError: index closed\n")
    probes["ready"] = True
    assert fetch(base + "/readyz")[0] == 200


def test_http_probes_default_to_ok():
    srv = MetricsServer(new_registry(), "127.0.0.1:0")
    with srv:
        assert fetch(f"http://127.0.0.1:{srv.port}/healthz")[::2] == (200, "ok\n")
        assert fetch(f"http://127.0.0.1:{srv.port}/readyz")[::2] == (200, "ok\n")


@pytest.mark.parametrize("path", ["/", "/metric", "/metrics/extra", "/favicon.ico"])
def test_http_unknown_paths_are_404(server, path):
    assert fetch(f"http://127.0.0.1:{server.port}{path}")[0] == 404


def test_stop_releases_the_port():
    first = MetricsServer(new_registry(), "127.0.0.1:0")
    first.start()
    port = first.port
    assert fetch(f"http://127.0.0.1:{port}/healthz")[0] == 200
    first.stop()
    first.stop()  # twice is fine
    with pytest.raises(OSError):
        fetch(f"http://127.0.0.1:{port}/healthz")
    second = MetricsServer(new_registry(), f"127.0.0.1:{port}")
    second.start()
    try:
        assert second.port == port and fetch(f"http://127.0.0.1:{port}/healthz")[0] == 200
    finally:
        second.stop()


def test_port_in_use_is_a_clear_oserror():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(OSError, match=rf"127\.0\.0\.1:{port}.*already in use by another process"):
            MetricsServer(new_registry(), f"127.0.0.1:{port}").start()


def test_start_twice_is_refused(server):
    with pytest.raises(RuntimeError, match="already started"):
        server.start()


def test_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    with MetricsServer(new_registry(), "[::1]:0") as srv:
        assert fetch(f"http://[::1]:{srv.port}/healthz")[::2] == (200, "ok\n")




def test_a_batch_histogram_is_exposed_as_prometheus_clients_histogram_of_the_same_values():
    """``BatchHistogram`` (the per-document histograms, counted a batch at a time) against ``Histogram``, in
    both exposition formats, for values on, between and past the bounds."""
    import random
    import re

    from prometheus_client import Histogram, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from streamdedup.ops.telemetry import BatchHistogram

    theirs, ours = new_registry(), new_registry()
    histogram = Histogram("x_per_document", "X.", buckets=(0, 1, 2, 3, 5, 10, 20, 50, 100), registry=theirs)
    batched = BatchHistogram("x_per_document", "X.", (0, 1, 2, 3, 5, 10, 20, 50, 100), ours)
    rng = random.Random(3)
    for _ in range(4):
        values = [rng.choice([0, 1, 2, 4, 7, 10, 11, 60, 100, 101, 5000]) for _ in range(rng.randrange(500))]
        counted: dict = {}
        for value in values:
            histogram.observe(value)
            counted[value] = counted.get(value, 0) + 1
        batched.observe_counted(counted)
    for generate in (generate_latest, generate_openmetrics):
        lines = [[re.sub(r"(_created\S*) .*", r"\1", line) for line in generate(registry).decode().splitlines()
                  if "x_per_document" in line] for registry in (theirs, ours)]
        assert lines[0] == lines[1] and len(lines[0]) >= 14
