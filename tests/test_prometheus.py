"""deploy/prometheus: the alert rules (promtool), the Grafana dashboard, and a real Prometheus scraping a worker.

Prometheus and promtool come from Debian's ``prometheus`` package, installed by
``deploy/prometheus/install.sh`` (``make test`` runs it).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import spawned
from kafka_helpers import Topics, produce, wait_for_line, worker_command
from prometheus_client import generate_latest
from test_metrics import parse_exposition

from streamdedup import config as config_module
from streamdedup.core import corpus
from streamdedup.engine.engine import Engine
from streamdedup.ops.telemetry import METRIC_NAMES, WorkerTelemetry

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "prometheus"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def tool(name: str) -> str:
    """The path of ``name``, or a failure that says how to install it (never a skip)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: run deploy/prometheus/install.sh (Debian's prometheus package)",
                    pytrace=False)
    return path


@pytest.mark.system
def test_promtool_checks_and_unit_tests_the_alert_rules():
    checked = subprocess.run([tool("promtool"), "check", "rules", "alerts.yml"], cwd=DEPLOY, capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS: 5 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = subprocess.run([tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=DEPLOY,
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_and_a_summary():
    import yaml

    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"][0]["rules"]
    tests = yaml.safe_load((DEPLOY / "alerts_test.yml").read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert {rule["alert"] for rule in rules} == fired
    assert all(rule["annotations"]["summary"] and rule["labels"]["severity"] for rule in rules)


@pytest.mark.system
def test_the_example_configuration_is_valid():
    checked = subprocess.run([tool("promtool"), "check", "config", "prometheus.yml"], cwd=DEPLOY,
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def exported_series(tmp_path) -> set[str]:
    """Every series name a worker's /metrics may carry (histogram samples and standard collectors included)."""
    with Engine(config_module.load(None, environ={}), str(tmp_path)) as engine:
        telemetry = WorkerTelemetry(engine.index, None)
        families = parse_exposition(generate_latest(telemetry.registry).decode())
    names = set(METRIC_NAMES) | {"up"}
    for family in families.values():
        names |= {name for name, _, _ in family["samples"]}
    for name in METRIC_NAMES:
        names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def queried_series(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers not followed by '(' and not keywords or label names."""
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    without_groupings = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_ranges)
    words = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", without_groupings))
    return {w for w in words if w not in {"and", "or", "unless", "bool", "offset"} and not re.fullmatch(r"\d.*", w)}


def test_the_dashboard_is_valid_json_and_queries_only_exported_metrics(tmp_path):
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) >= 10
    queried = set().union(*(queried_series(expr) for expr in exprs))
    assert queried - exported_series(tmp_path) == set()
    documented = {m for m in METRIC_NAMES if any(m in e for e in exprs)}
    assert documented == set(METRIC_NAMES), "every streamdedup metric has a panel"
    assert "process_resident_memory_bytes" in queried
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_rules_query_only_exported_metrics(tmp_path):
    import yaml

    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"][0]["rules"]
    queried = set().union(*(queried_series(rule["expr"]) for rule in rules))
    assert queried - exported_series(tmp_path) == set()


# --- a real Prometheus scraping a real worker -------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with _OPENER.open(url, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def scalar(base: str, promql: str) -> float | None:
    result = query(base, promql)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def start_prometheus(tmp_path: Path, target: str) -> tuple[list[str], str]:
    """The command of a Prometheus that scrapes ``target`` every second, and its address."""
    tmp_path.mkdir()
    shutil.copy(DEPLOY / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "rule_files: [alerts.yml]\n"
        "scrape_configs:\n"
        "  - job_name: streamdedup\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n")
    address = f"127.0.0.1:{free_port()}"
    command = [tool("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
               f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address={address}"]
    return command, f"http://{address}"


def test_prometheus_scrapes_the_documented_series_from_a_running_worker(kafka, tmp_path):
    docs = corpus.generate(60, seed=5)
    topics = Topics.fresh(kafka, partitions=2)
    records = [(d.id.encode(), json.dumps({"id": d.id, "text": d.text}).encode()) for d in docs]
    records.append((b"bad", b"{nope"))
    produce(kafka, topics.raw, records, partition_of=lambda n: n % 2)
    with spawned(worker_command(tmp_path / "state", topics, kafka), stderr=subprocess.PIPE) as worker:
        try:
            started = wait_for_line(worker, b"started")
            target = re.search(rb'metrics="http://([^"/]+)/metrics"', started).group(1).decode()
            command, base = start_prometheus(tmp_path / "prometheus", target)
            with spawned(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as prometheus:
                try:
                    deadline = time.monotonic() + 90
                    while True:
                        try:
                            decided = scalar(base, 'sum(streamdedup_documents_total{job="streamdedup"})')
                            lag = scalar(base, "sum(streamdedup_consumer_lag_records)")
                        except OSError:  # Prometheus still starting
                            decided = lag = None
                        if decided == len(records) and lag == 0:
                            break
                        assert prometheus.poll() is None, prometheus.stderr.read().decode()
                        assert time.monotonic() < deadline, (decided, lag)
                        time.sleep(0.5)
                    assert scalar(base, 'up{job="streamdedup"}') == 1
                    assert scalar(base, 'streamdedup_documents_total{outcome="rejected"}') == 1
                    assert scalar(base, 'streamdedup_rejected_total{reason="invalid_json"}') == 1
                    kept = scalar(base, 'streamdedup_documents_total{outcome="kept"}')
                    assert 0 < kept < len(docs)
                    assert scalar(base, "streamdedup_index_documents") == len(docs)
                    assert scalar(base, "streamdedup_index_clusters") == kept
                    assert scalar(base, "streamdedup_ready") == 1
                    assert scalar(base, "streamdedup_batch_duration_seconds_count") >= 1
                    assert scalar(base, "streamdedup_index_map_used_bytes") <= \
                        scalar(base, "streamdedup_index_map_size_bytes")
                    assert 10 << 20 < scalar(base, "process_resident_memory_bytes") < 8 << 30
                    assert scalar(base, "process_cpu_seconds_total") > 0
                    assert scalar(base, "process_open_fds") > 3
                    assert query(base, "python_info")[0]["metric"]["implementation"] == "CPython"
                    names = {r["metric"]["__name__"] for r in
                             query(base, 'count by (__name__) ({job="streamdedup", __name__=~"streamdedup_.*"})')}
                    families = {re.sub(r"_(bucket|sum|count|created)$", "", n) for n in names}
                    assert set(METRIC_NAMES) <= families
                    with _OPENER.open(f"{base}/api/v1/rules", timeout=10) as response:
                        groups = json.load(response)["data"]["groups"]
                    rules = [rule for group in groups for rule in group["rules"]]
                    assert len(rules) == 5 and all(rule["health"] == "ok" for rule in rules), rules
                    assert all(rule["state"] == "inactive" for rule in rules), rules
                finally:
                    prometheus.send_signal(signal.SIGTERM)
                    prometheus.wait(timeout=30)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
