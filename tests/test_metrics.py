"""streamdedup.ops.metrics: exposition text (checked with a small parser), errors, the HTTP server."""

from __future__ import annotations

import math
import re
import socket
import threading
import urllib.error
import urllib.request

import pytest

from streamdedup.ops.metrics import CONTENT_TYPE, MetricsServer, Registry, parse_address

BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# --- a minimal parser of the text exposition format 0.0.4 -------------------------------------------

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)=\"")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _unescape(text: str, start: int, stop_at: str | None) -> tuple[str, int]:
    """Read an escaped string from ``start`` up to ``stop_at`` (or the end); return it and the end index."""
    out, i = [], start
    while i < len(text) and text[i] != stop_at:
        if text[i] == "\\":
            out.append(_ESCAPES[text[i + 1]])  # KeyError on an escape the format does not allow
            i += 2
        else:
            assert text[i] != "\n"
            out.append(text[i])
            i += 1
    if stop_at is not None:
        assert i < len(text), f"unterminated label value in {text!r}"
    return "".join(out), i


def parse_sample(line: str) -> tuple[str, dict[str, str], float]:
    name = _NAME.match(line).group(0)
    i, labels = len(name), {}
    if line[i] == "{":
        i += 1
        while line[i] != "}":
            match = _LABEL.match(line, i)
            assert match, f"bad label at {line[i:]!r}"
            assert match.group(1) not in labels, f"label repeated in {line!r}"
            labels[match.group(1)], i = _unescape(line, match.end(), '"')
            i += 1
            if line[i] == ",":
                i += 1
        i += 1
    assert line[i] == " ", f"expected a space before the value in {line!r}"
    value = line[i + 1:]
    assert re.fullmatch(r"[+-]?Inf|NaN|[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", value), value
    return name, labels, float(value)


def parse_exposition(text: str) -> dict[str, dict]:
    """Families by name: ``{"help", "type", "samples": [(name, labels, value)]}``; asserts well-formedness."""
    assert text == "" or text.endswith("\n")
    families: dict[str, dict] = {}
    current = None
    for line in text.split("\n")[:-1]:
        if line.startswith("# HELP "):
            name, _, doc = line[len("# HELP "):].partition(" ")
            assert name not in families, f"HELP for {name} twice"
            families[name] = {"help": _unescape(doc, 0, None)[0], "type": None, "samples": []}
            current = name
        elif line.startswith("# TYPE "):
            name, kind = line[len("# TYPE "):].split(" ")
            assert name == current and families[name]["type"] is None, f"TYPE for {name} misplaced"
            assert kind in ("counter", "gauge", "histogram")
            families[name]["type"] = kind
        else:
            name, labels, value = parse_sample(line)
            family = families[current]
            allowed = {current}
            if family["type"] == "histogram":
                allowed = {current + "_bucket", current + "_sum", current + "_count"}
            assert name in allowed, f"sample {name} inside family {current}"
            if family["type"] == "counter":
                assert name.endswith("_total")
            key = (name, tuple(sorted(labels.items())))
            assert key not in {(n, tuple(sorted(l.items()))) for n, l, _ in family["samples"]}, key
            family["samples"].append((name, labels, value))
    assert all(f["type"] for f in families.values())
    return families


def value_of(families: dict, family: str, name: str | None = None, **labels: str) -> float:
    found = [v for n, l, v in families[family]["samples"] if n == (name or family) and l == labels]
    assert len(found) == 1, f"{name or family}{labels} not found once in {families[family]['samples']}"
    return found[0]


def scrape(registry: Registry) -> dict[str, dict]:
    return parse_exposition(registry.exposition())


# --- exposition -----------------------------------------------------------------------------------------

def test_counter_with_labels():
    reg = Registry()
    docs = reg.counter("streamdedup_documents_total", "Documents decided, by outcome.", labels=("outcome",))
    reg.counter("streamdedup_rejected_total", "Rejected records by reason.", labels=("reason",))
    plain = reg.counter("streamdedup_batches_total", "Batches.")
    docs.inc(outcome="kept")
    docs.inc(5, outcome="duplicate")
    docs.inc(outcome="kept")
    families = scrape(reg)
    fam = families["streamdedup_documents_total"]
    assert fam["type"] == "counter" and fam["help"] == "Documents decided, by outcome."
    assert value_of(families, "streamdedup_documents_total", outcome="kept") == 2
    assert value_of(families, "streamdedup_documents_total", outcome="duplicate") == 5
    # labelled, never updated: HELP and TYPE only; unlabelled: a 0 sample
    assert families["streamdedup_rejected_total"]["samples"] == []
    assert value_of(families, "streamdedup_batches_total") == 0
    plain.inc(2.5)
    assert value_of(scrape(reg), "streamdedup_batches_total") == 2.5
    assert docs.value(outcome="kept") == 2


def test_exposition_text_exactly():
    reg = Registry()
    reg.counter("a_total", "A.", labels=("x",)).inc(3, x="1")
    reg.gauge("b", "B.").set(0.25)
    assert reg.exposition() == ('# HELP a_total A.\n# TYPE a_total counter\na_total{x="1"} 3\n'
                                "# HELP b B.\n# TYPE b gauge\nb 0.25\n")


def test_label_values_and_help_are_escaped():
    reg = Registry()
    gauge = reg.gauge("weird", 'Help with \\ backslash\nand a newline and "quotes".', labels=("a", "b"))
    nasty = ['say "hi"', "C:\\path\\", "two\nlines", "} 1", ",=", "ünïcode"]
    for n, text in enumerate(nasty):
        gauge.set(n, a=text, b="plain")
    text = reg.exposition()
    assert '\\"hi\\"' in text and "C:\\\\path\\\\" in text and "two\\nlines" in text
    assert len(text.strip("\n").split("\n")) == 2 + len(nasty)  # no raw newline leaked
    families = parse_exposition(text)
    assert families["weird"]["help"] == 'Help with \\ backslash\nand a newline and "quotes".'
    for n, text in enumerate(nasty):
        assert value_of(families, "weird", a=text, b="plain") == n


def test_histogram_buckets_sum_and_count():
    reg = Registry()
    batch = reg.histogram("streamdedup_batch_duration_seconds", "Time per batch.", buckets=BUCKETS)
    observations = [0.3, 0.001, 0.25, 0.25, 1, 7, 42, 0.05]
    for value in observations:
        batch.observe(value)
    families = scrape(reg)
    fam = families["streamdedup_batch_duration_seconds"]
    assert fam["type"] == "histogram"
    buckets = [(l["le"], v) for n, l, v in fam["samples"] if n.endswith("_bucket")]
    assert [le for le, _ in buckets] == ["0.01", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"]
    counts = [v for _, v in buckets]
    assert counts == sorted(counts)  # cumulative
    for le, count in buckets:  # le is inclusive: value <= bound
        assert count == sum(1 for o in observations if o <= float(le))
    total = value_of(families, fam_name := "streamdedup_batch_duration_seconds", fam_name + "_count")
    assert total == len(observations) == counts[-1]
    assert value_of(families, fam_name, fam_name + "_sum") == pytest.approx(sum(observations))


def test_histogram_with_labels_and_nan():
    reg = Registry()
    hist = reg.histogram("lat_seconds", "Latency.", labels=("stage",), buckets=(1, 2, math.inf))
    assert scrape(reg)["lat_seconds"]["samples"] == []
    hist.observe(1.5, stage="decide")
    hist.observe(float("nan"), stage="commit")
    families = scrape(reg)
    assert value_of(families, "lat_seconds", "lat_seconds_bucket", stage="decide", le="1") == 0
    assert value_of(families, "lat_seconds", "lat_seconds_bucket", stage="decide", le="2") == 1
    assert value_of(families, "lat_seconds", "lat_seconds_bucket", stage="decide", le="+Inf") == 1
    assert value_of(families, "lat_seconds", "lat_seconds_bucket", stage="commit", le="2") == 0
    assert value_of(families, "lat_seconds", "lat_seconds_bucket", stage="commit", le="+Inf") == 1
    assert math.isnan(value_of(families, "lat_seconds", "lat_seconds_sum", stage="commit"))


@pytest.mark.parametrize("value, text", [(1, "1"), (1.0, "1"), (0.25, "0.25"), (-3, "-3"), (1e-7, "1e-07"),
                                         (1e300, "1e+300"), (math.inf, "+Inf"), (-math.inf, "-Inf"),
                                         (math.nan, "NaN")])
def test_float_formatting(value, text):
    reg = Registry()
    reg.gauge("g", "G.").set(value)
    assert reg.exposition().split("\n")[2] == f"g {text}"
    parse_exposition(reg.exposition())


def test_gauge_set_inc_dec_remove():
    reg = Registry()
    lag = reg.gauge("streamdedup_consumer_lag", "Records behind.", labels=("topic", "partition"))
    lag.set(42, topic="raw", partition="0")
    lag.set(7, topic="raw", partition=1)  # values are turned into strings
    lag.inc(topic="raw", partition="1")
    lag.dec(3, topic="raw", partition="0")
    families = scrape(reg)
    assert value_of(families, "streamdedup_consumer_lag", topic="raw", partition="0") == 39
    assert value_of(families, "streamdedup_consumer_lag", topic="raw", partition="1") == 8
    lag.remove(topic="raw", partition="0")
    lag.remove(topic="raw", partition="9")  # absent: nothing to do
    samples = scrape(reg)["streamdedup_consumer_lag"]["samples"]
    assert samples == [("streamdedup_consumer_lag", {"topic": "raw", "partition": "1"}, 8)]


def test_set_function_is_evaluated_at_scrape():
    reg = Registry()
    index_docs = reg.gauge("streamdedup_index_documents", "Documents in the index.")
    state = {"n": 123}
    index_docs.set_function(lambda: state["n"])
    assert value_of(scrape(reg), "streamdedup_index_documents") == 123
    state["n"] = 124
    assert value_of(scrape(reg), "streamdedup_index_documents") == 124
    index_docs.set_function(None)
    index_docs.set(5)
    assert value_of(scrape(reg), "streamdedup_index_documents") == 5


def test_set_function_raising_skips_only_that_sample():
    reg = Registry()
    reg.counter("before_total", "Before.").inc()
    broken = reg.gauge("broken", "Raises at scrape.")
    broken.set_function(lambda: 1 / 0)
    reg.gauge("not_a_number", "Returns junk.").set_function(lambda: "junk")
    reg.gauge("after", "After.").set(2)
    families = scrape(reg)
    assert families["broken"]["samples"] == [] and families["not_a_number"]["samples"] == []
    assert value_of(families, "before_total") == 1 and value_of(families, "after") == 2


def test_set_function_needs_an_unlabelled_gauge():
    gauge = Registry().gauge("g", "G.", labels=("x",))
    with pytest.raises(ValueError, match="without labels"):
        gauge.set_function(lambda: 1)


def test_empty_registry():
    assert Registry().exposition() == ""


# --- errors ---------------------------------------------------------------------------------------------

def test_counter_name_must_end_in_total():
    with pytest.raises(ValueError, match="must end in '_total'"):
        Registry().counter("streamdedup_documents", "Docs.")


@pytest.mark.parametrize("name", ["", "1abc", "has-dash", "has space", "é"])
def test_bad_metric_names(name):
    with pytest.raises(ValueError, match="metric name"):
        Registry().gauge(name, "Bad.")


@pytest.mark.parametrize("labels", [("1x",), ("a-b",), ("__reserved",), ("",), ("x", "x"), "outcome"])
def test_bad_label_names(labels):
    with pytest.raises(ValueError, match="label"):
        Registry().gauge("g", "G.", labels=labels)


def test_histogram_reserves_le_and_checks_buckets():
    with pytest.raises(ValueError, match="'le'"):
        Registry().histogram("h", "H.", labels=("le",))
    for buckets in [(), (1, 1), (2, 1), (1, math.nan), (math.inf,)]:
        with pytest.raises(ValueError, match="strictly increasing"):
            Registry().histogram("h", "H.", buckets=buckets)


def test_duplicate_registration():
    reg = Registry()
    reg.counter("x_total", "X.")
    with pytest.raises(ValueError, match="already registered"):
        reg.counter("x_total", "Again.")
    with pytest.raises(ValueError, match="already registered"):
        reg.gauge("x_total", "As a gauge.")
    reg.histogram("h", "H.")
    with pytest.raises(ValueError, match="h_count"):
        reg.gauge("h_count", "Clashes with the histogram's samples.")


def test_wrong_labels_name_the_expected_ones():
    reg = Registry()
    docs = reg.counter("docs_total", "Docs.", labels=("outcome",))
    lag = reg.gauge("lag", "Lag.", labels=("topic", "partition"))
    hist = reg.histogram("h", "H.")
    with pytest.raises(ValueError, match=r"expects labels \(outcome\), got \(reason\)"):
        docs.inc(reason="x")
    with pytest.raises(ValueError, match=r"expects labels \(outcome\), got \(\)"):
        docs.inc()
    with pytest.raises(ValueError, match=r"expects labels \(topic, partition\)"):
        lag.set(1, topic="raw")
    with pytest.raises(ValueError, match=r"expects labels \(\), got \(stage\)"):
        hist.observe(1, stage="x")
    assert scrape(reg)["docs_total"]["samples"] == []


def test_counter_cannot_go_down():
    counter = Registry().counter("c_total", "C.")
    for amount in (-1, math.nan):
        with pytest.raises(ValueError, match="only go up"):
            counter.inc(amount)


def test_a_label_may_be_called_amount_or_value():
    reg = Registry()
    reg.counter("c_total", "C.", labels=("amount",)).inc(2, amount="x")
    reg.gauge("g", "G.", labels=("value",)).set(3, value="y")
    families = scrape(reg)
    assert value_of(families, "c_total", amount="x") == 2 and value_of(families, "g", value="y") == 3


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


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with _OPENER.open(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read().decode("utf-8")


@pytest.fixture
def probes():
    return {"ready": (True, "consuming"), "healthy": (True, "ok")}


@pytest.fixture
def server(probes):
    reg = Registry()
    reg.counter("streamdedup_documents_total", "Docs.", labels=("outcome",)).inc(3, outcome="kept")

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
    assert status == 200 and content_type == CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert value_of(parse_exposition(body), "streamdedup_documents_total", outcome="kept") == 3
    status, _, body = fetch(f"http://127.0.0.1:{server.port}/metrics?name[]=x")
    assert status == 200 and "streamdedup_documents_total" in body


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
    srv = MetricsServer(Registry(), "127.0.0.1:0")
    with srv:
        assert fetch(f"http://127.0.0.1:{srv.port}/healthz")[::2] == (200, "ok\n")
        assert fetch(f"http://127.0.0.1:{srv.port}/readyz")[::2] == (200, "ok\n")


@pytest.mark.parametrize("path", ["/", "/metric", "/metrics/extra", "/favicon.ico"])
def test_http_unknown_paths_are_404(server, path):
    assert fetch(f"http://127.0.0.1:{server.port}{path}")[0] == 404


def test_stop_releases_the_port():
    first = MetricsServer(Registry(), "127.0.0.1:0")
    first.start()
    port = first.port
    assert fetch(f"http://127.0.0.1:{port}/healthz")[0] == 200
    first.stop()
    first.stop()  # twice is fine
    with pytest.raises(OSError):
        fetch(f"http://127.0.0.1:{port}/healthz")
    second = MetricsServer(Registry(), f"127.0.0.1:{port}")
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
            MetricsServer(Registry(), f"127.0.0.1:{port}").start()


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
    with MetricsServer(Registry(), "[::1]:0") as srv:
        assert fetch(f"http://[::1]:{srv.port}/healthz")[::2] == (200, "ok\n")


# --- concurrency ------------------------------------------------------------------------------------------

def test_concurrent_updates_while_scraping():
    reg = Registry()
    docs = reg.counter("docs_total", "Docs.", labels=("outcome",))
    hist = reg.histogram("batch_seconds", "Batches.", buckets=(0.25, 1))
    busy = reg.gauge("busy", "Workers inside the loop body.")
    threads_n, rounds = 4, 3000
    start = threading.Barrier(threads_n + 1)

    def work(n):
        start.wait()
        for i in range(rounds):
            busy.inc()
            docs.inc(outcome="kept" if i % 2 else "duplicate")
            hist.observe(0.5)  # exact in binary: _sum must be exactly 0.5 * _count in every snapshot
            busy.dec()

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
    for worker in workers:
        worker.start()
    with MetricsServer(reg, "127.0.0.1:0") as srv:
        start.wait()
        scrapes = 0
        while any(worker.is_alive() for worker in workers) or scrapes < 5:
            text = fetch(f"http://127.0.0.1:{srv.port}/metrics")[2] if scrapes % 10 == 0 else reg.exposition()
            families = parse_exposition(text)
            count = value_of(families, "batch_seconds", "batch_seconds_count")
            assert value_of(families, "batch_seconds", "batch_seconds_bucket", le="+Inf") == count
            assert value_of(families, "batch_seconds", "batch_seconds_bucket", le="1") == count
            assert value_of(families, "batch_seconds", "batch_seconds_bucket", le="0.25") == 0
            assert value_of(families, "batch_seconds", "batch_seconds_sum") == 0.5 * count
            assert 0 <= value_of(families, "busy") <= threads_n
            scrapes += 1
        for worker in workers:
            worker.join()
        families = parse_exposition(fetch(f"http://127.0.0.1:{srv.port}/metrics")[2])
    half = threads_n * rounds // 2
    assert value_of(families, "docs_total", outcome="kept") == half
    assert value_of(families, "docs_total", outcome="duplicate") == half
    assert value_of(families, "batch_seconds", "batch_seconds_count") == threads_n * rounds
    assert value_of(families, "busy") == 0
