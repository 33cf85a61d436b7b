"""``bench/live.py --variants``: which web crawl contenders a run measures (issue 31, item 5: the live rate
with template learning against the rate without it)."""

from __future__ import annotations

import os

import pytest

from bench import live


def test_all_contenders_by_default_and_templates_off_always_as_the_base():
    assert live.web_contenders("") == list(live.WEB_VARIANTS)
    assert live.web_contenders("templates (default)") == ["templates (default)", "templates off"]
    both = live.web_contenders("templates (default);templates, repeats off")
    assert both == ["templates (default)", "templates, repeats off", "templates off"]
    assert live.web_contenders("templates off;templates (default)") == ["templates off", "templates (default)"]


def test_an_unknown_contender_is_refused_with_the_names_to_choose_from():
    with pytest.raises(SystemExit, match="templates, repeats off"):
        live.web_contenders("templates, repeats")


def test_learning_on_and_off_are_both_contenders():
    """The default learns what each site repeats; a contender turns it off, one turns templates off."""
    assert live.WEB_VARIANTS["templates (default)"] == live.URLS
    assert "templates.repeats=false" in live.WEB_VARIANTS["templates, repeats off"]
    assert "templates.enabled=false" in live.WEB_VARIANTS["templates off"]


def test_cpu_columns_are_medians_a_document_and_the_cores_kept_busy():
    """Worker and broker CPU a document (µs) and cores busy, medians over the rounds; a round whose broker CPU is
    unknown counts for the cores without it, and a contender without any shows none."""
    columns = live.cpu_columns({"a": [(2.0, 0.5, 2.0), (4.0, 1.5, 4.0), (3.0, None, 2.0)], "b": [(1.0, None, 1.0)]},
                               1000)
    assert columns["worker CPU µs a doc"] == {"a": "3,000", "b": "1,000"}
    assert columns["broker CPU µs a doc"] == {"a": "1,000", "b": "-"}
    assert columns["cores busy"] == {"a": "1.38", "b": "1.00"}


def test_the_broker_cpu_is_read_from_its_data_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("BENCH_KAFKA_DATA_DIR", raising=False)
    assert live.broker_cpu() is None
    monkeypatch.setenv("BENCH_KAFKA_DATA_DIR", str(tmp_path))
    assert live.broker_cpu() is None  # no pid file
    (tmp_path / live.BROKER_PID_FILE).write_text(f"{os.getpid()}\n")
    before = live.broker_cpu()
    sum(i * i for i in range(300_000))
    assert before is not None and live.broker_cpu() >= before
