"""/readyz and /healthz of the worker's telemetry, over HTTP, on a real index."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from prometheus_client import generate_latest

from streamdedup import config as config_module
from streamdedup.core.records import Decision
from streamdedup.engine.engine import Engine
from streamdedup.ops.telemetry import WorkerTelemetry


def status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def telemetry(tmp_path):
    with Engine(config_module.load(None, environ={}), str(tmp_path)) as engine:
        t = WorkerTelemetry(engine.index, "127.0.0.1:0")
        t.refresh_index()
        t.start()
        try:
            yield t
        finally:
            t.stop()


def test_ready_only_while_consuming(telemetry):
    base = telemetry.url().rsplit("/", 1)[0]
    assert status(base + "/readyz") == (503, "no partitions assigned yet\n")
    telemetry.assigned = True
    assert status(base + "/readyz")[0] == 200
    telemetry.waiting_for = "the batch's Kafka transaction"
    code, body = status(base + "/readyz")
    assert code == 503 and "waiting for the broker" in body
    telemetry.waiting_for = None
    assert status(base + "/healthz")[0] == 200
    telemetry.stopping = True
    assert status(base + "/readyz") == (503, "stopping\n")


def test_not_ready_when_the_index_map_cannot_grow(tmp_path):
    from streamdedup.core.records import Document, Source
    from streamdedup.store.index import IndexSettings

    cfg = config_module.load(None, ("index.map_size_mb=1",), environ={})
    with Engine(cfg, str(tmp_path)) as engine:
        engine.index.settings = IndexSettings(engine.index.path, 1 << 20, True, max_map_size=1 << 20)
        telemetry = WorkerTelemetry(engine.index, None)
        telemetry.assigned = True
        texts = [f"document {i} " + " ".join(f"w{i}x{j}" for j in range(200)) for i in range(2000)]
        with pytest.raises(Exception, match="the most an index may grow to"):
            for start in range(0, 2000, 4):
                items = [Document(f"d{start + k}", t, Source("t", -1, start + k)) for k, t in
                         enumerate(texts[start:start + 4])]
                engine.decide_batch(engine.prepare(items))
                telemetry.refresh_index()
        telemetry.refresh_index()
        assert telemetry.readiness() == (False, "the index map is full at its fixed limit: compact it (streamdedup backup) "
                                          "or start a new index")


def test_batch_counts(telemetry):
    telemetry.batch_done([Decision("a", "kept", "a", candidates=2, verified=1),
                          Decision("b", "duplicate", "a", "a", 1.0, exact=True),
                          Decision("c", "rejected", reason="invalid_json: bad"),
                          Decision("a", "kept", "a", replayed=True)], 0.2)
    text = generate_latest(telemetry.registry).decode()
    assert 'streamdedup_documents_total{outcome="kept"} 1.0' in text
    assert 'streamdedup_documents_total{outcome="exact_duplicate"} 1.0' in text
    assert 'streamdedup_rejected_total{reason="invalid_json"} 1.0' in text
    assert "streamdedup_replayed_total 1.0" in text


def test_unhealthy_once_one_step_waited_past_the_stall_timeout(telemetry):
    base = telemetry.url().rsplit("/", 1)[0]
    telemetry.stall_timeout_s = 300.0
    telemetry.current_step = lambda: ("the batch's Kafka transaction", 120.0)
    assert status(base + "/healthz") == (200, "ok\n")
    telemetry.current_step = lambda: ("the batch's Kafka transaction", 301.0)
    code, body = status(base + "/healthz")
    assert code == 503 and "stalled: waiting 301 s for the batch's Kafka transaction" in body
    telemetry.current_step = lambda: (None, 5000.0)  # idle in our own code: not a stall
    assert status(base + "/healthz")[0] == 200
    telemetry.stall_timeout_s = 0.0
    telemetry.current_step = lambda: ("records from the input topics", 5000.0)
    assert status(base + "/healthz")[0] == 200
