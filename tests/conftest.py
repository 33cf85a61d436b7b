"""Shared fixtures: the sample crawl corpus, a fresh index folder, a CLI runner, the test broker.

Every test that needs a broker carries the ``kafka`` marker (the ones using the
``kafka`` fixture get it here), so ``pytest -m "not kafka"`` runs the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamdedup.core import corpus

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items):
    for item in items:
        if "kafka" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request, monkeypatch):
    """A test marked neither ``kafka`` nor ``system`` is in the fast tier (``make test-fast``): pure logic,
    real LMDB files, no broker and no other process. Starting one there fails, naming the marker to add."""
    if request.node.get_closest_marker("kafka") or request.node.get_closest_marker("system"):
        return
    import multiprocessing.process

    def refused(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.system (docs/pages/contributing.md, "
                             "Tests), or test the logic without one")

    monkeypatch.setattr(subprocess.Popen, "__init__", refused)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refused)


@pytest.fixture(scope="session")
def crawl():
    """The 650-article sample crawl (about 1,190 documents)."""
    return corpus.generate(650, seed=42)


@pytest.fixture(scope="session")
def crawl_file(tmp_path_factory, crawl):
    path = tmp_path_factory.mktemp("crawl") / "crawl.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        corpus.write_jsonl(crawl, handle)
    return path


def run_cli(*args: str, env: dict | None = None, stdin: bytes | None = None, check: bool = True,
            cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m streamdedup ARGS`` in a fresh process."""
    merged = dict(os.environ, **(env or {}))
    result = subprocess.run([sys.executable, "-m", "streamdedup", *args], input=stdin, capture_output=True,
                            env=merged, cwd=cwd, timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f"streamdedup {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stderr.decode(errors='replace')}")
    return result


@contextlib.contextmanager
def spawned(command, **kwargs):
    """``subprocess.Popen`` that kills the process when the block ends while it still runs.

    ``with subprocess.Popen(...)`` waits without limit for the process at the
    end of the block, so a test that failed or timed out against a process
    that hangs would hang the whole run.
    """
    with subprocess.Popen(command, **kwargs) as process:  # its exit waits for the process: kill it first
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def index_snapshot(state) -> dict:
    """Everything the index decided, without timestamps: comparable between runs."""
    from streamdedup.store.bands import band_entries
    from streamdedup.store.index import Index, IndexSettings

    index = Index(IndexSettings(path=str(state)), None, readonly=True)
    try:
        with index.read() as txn:
            records = [
                (r.serial, r.id, r.kept, r.cluster, r.matched, r.similarity, r.exact, r.content, r.source,
                 r.band_keys)
                for r in txn.records()
            ]
            bands = list(band_entries(txn))
            counters = dict(txn.counters)
        return {"records": records, "bands": bands, "counters": counters}
    finally:
        index.close()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """A real Apache Kafka broker: $KAFKA_BOOTSTRAP if set, else one started by deploy/kafka/start.sh."""
    existing = os.environ.get("KAFKA_BOOTSTRAP")
    if existing:
        yield existing
        return
    env = broker_env(tmp_path_factory.mktemp("kafka"), os.environ.get("STREAMDEDUP_TEST_KAFKA_PORT", "29092"))
    try:
        yield start_broker(env)
    finally:
        subprocess.run([str(ROOT / "deploy/kafka/stop.sh"), "--wipe"], env=env, capture_output=True)


def start_broker(env: dict) -> str:
    """Start a broker with deploy/kafka/start.sh; its bootstrap address, or a failure that says what is missing."""
    started = subprocess.run([str(ROOT / "deploy/kafka/start.sh")], env=env, capture_output=True, text=True)
    if started.returncode == 0:
        return started.stdout.strip().splitlines()[-1]
    tools = [("java", "Java 17+ runs the broker"), ("mvn", "Maven fetches the broker's jars on first use")]
    if env.get("KAFKA_SECURE") == "1":
        tools.append(("keytool", "it comes with Java and makes the --secure broker's certificates"))
    missing = [f"{tool} is not on PATH ({why})" for tool, why in tools if shutil.which(tool) is None]
    pytest.fail(
        "the test broker did not start" + (": " + "; ".join(missing) if missing else "") + ".\n"
        "Install what is missing, or set KAFKA_BOOTSTRAP=host:port to use a running broker, or leave out "
        f"the tests that need one with: pytest -m \"not kafka\"\n{started.stdout}\n{started.stderr}",
        pytrace=False,
    )


def broker_env(data_dir, port: str) -> dict:
    return dict(os.environ, KAFKA_PORT=str(port), KAFKA_DATA_DIR=str(data_dir / f"broker-{port}"))


class OwnBroker:
    """A broker of a test's own, to stop and start again; on ``$STREAMDEDUP_TEST_OUTAGE_PORT`` (29192)."""

    def __init__(self, data_dir):
        port = os.environ.get("STREAMDEDUP_TEST_OUTAGE_PORT", "29192")
        self.env = broker_env(data_dir, port)
        self.data_dir = data_dir / f"broker-{port}"
        self.bootstrap = self.start()

    def start(self) -> str:
        return start_broker(self.env)

    def stop(self, how: str = "graceful") -> None:
        """SIGTERM and wait (``graceful``), or SIGKILL (``kill``)."""
        if how == "kill":
            os.kill(int((self.data_dir / "broker.pid").read_text()), signal.SIGKILL)
        subprocess.run([str(ROOT / "deploy/kafka/stop.sh")], env=self.env, check=True, capture_output=True)

    def freeze(self, seconds: float) -> None:
        """Stop the broker's process (SIGSTOP) for ``seconds``: its connections stay open and nothing answers."""
        pid = int((self.data_dir / "broker.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def wipe(self) -> None:
        subprocess.run([str(ROOT / "deploy/kafka/stop.sh"), "--wipe"], env=self.env, capture_output=True)
