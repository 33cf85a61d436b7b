"""Configuration: file, environment, --set; every mistake named precisely."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from streamdedup.config import (SECTIONS, Config, ShardsSection, kafka_client_settings, load, redacted,
                                transaction_producer_settings, with_values)
from streamdedup.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_config_toml_lists_every_key_with_its_default_and_a_comment():
    text = (ROOT / "config.toml").read_text()
    data = tomllib.loads(text)
    defaults = Config()
    for section, cls in SECTIONS.items():
        for spec in dataclasses.fields(cls):
            value = getattr(getattr(defaults, section), spec.name)
            if isinstance(value, dict):
                assert f"[{section}.{spec.name}]" in text
                continue
            assert data[section][spec.name] == value, f"{section}.{spec.name}"
            line = next(l for l in text.splitlines() if l.startswith(f"{spec.name} = "))
            assert "  # " in line, f"{section}.{spec.name} has no comment"
    assert load(str(ROOT / "config.toml"), environ={}) == defaults


def test_precedence_file_then_environment_then_flags(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[lsh]\nthreshold = 0.6\n[signing]\nk = 4\n')
    cfg = load(str(path), ("lsh.threshold=0.9",), {"STREAMDEDUP_LSH_THRESHOLD": "0.8", "STREAMDEDUP_SIGNING_K": "5"})
    assert cfg.lsh.threshold == 0.9 and cfg.signing.k == 5
    cfg = load(None, ("input.topics=a, b",), {"STREAMDEDUP_INPUT_FORMAT": "msgpack"})
    assert cfg.input.topics == ["a", "b"] and cfg.input.format == "msgpack"


@pytest.mark.parametrize(
    "override,message",
    [
        ("lsh.treshold=0.8", "unknown key 'treshold' in [lsh]; did you mean 'threshold'?"),
        ("lsh.threshold=1.5", "lsh.threshold must be between 0.01 and 0.99, got 1.5"),
        ("signing.k=three", "signing.k must be an integer, got 'three'"),
        ("signing.shingle=letters", "signing.shingle must be one of 'word', 'char'"),
        ("index.sync=maybe", "index.sync must be true or false"),
        ("singing.k=3", "unknown section [singing]; did you mean 'signing'?"),
        ("lsh.bands=10", "lsh.bands and lsh.rows are set together"),
        ("kafka.linger_msec=5", "did you mean 'linger_ms'?"),
        ("lsh", "expected section.key=value"),
        ("shards.batch_bytes=67108864", "shards.batch_bytes must be between 65536 and 33554432, got 67108864"),
    ],
)
def test_mistakes_are_named_with_section_key_and_nearest_valid_key(override, message):
    with pytest.raises(ConfigError) as caught:
        load(None, (override,), {})
    assert message in str(caught.value)


def test_a_vshards_home_message_fits_the_internal_topics_at_the_largest_batch_bytes():
    """``shards.batch_bytes`` is what an epoch gives each vshard on average, in one message (its home message);
    at its highest a vshard given twice the average still fits the internal topics' ``max.message.bytes``."""
    from streamdedup.runtime.vshards.topics import SIGNED_MESSAGE_BYTES

    spec = next(f for f in dataclasses.fields(ShardsSection) if f.name == "batch_bytes")
    assert ShardsSection().batch_bytes <= spec.metadata["high"] and 2 * spec.metadata["high"] <= SIGNED_MESSAGE_BYTES


def test_bands_times_rows_must_fit_the_signature():
    with pytest.raises(ConfigError, match="exceeds signing.num_perm"):
        load(None, ("lsh.bands=20", "lsh.rows=10"), {})


def test_kafka_settings_pass_through_and_secrets_stay_hidden(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("hunter2\n")
    cfg = load(None, ("kafka.linger_ms=7", "kafka.sasl_plain_username=me",
                      f"kafka.sasl_plain_password_file={secret}"), {"STREAMDEDUP_KAFKA_SASL_PLAIN_PASSWORD": "x"})
    producer = kafka_client_settings(cfg.kafka, "producer")
    assert producer["linger_ms"] == 7 and producer["sasl_plain_password"] == "hunter2"
    assert "linger_ms" not in kafka_client_settings(cfg.kafka, "consumer")  # the producer's alone
    shown = redacted(cfg)
    assert shown["kafka"]["sasl_plain_password"] == "***"
    assert "hunter2" not in repr(shown)


def test_a_kafka_setting_of_one_client_goes_to_that_client_only():
    """A consumer's setting under [kafka] reaches the consumer, not the producer (which would refuse it)."""
    cfg = load(None, ("kafka.session_timeout_ms=6000", "kafka.acks=1", "kafka.request_timeout_ms=9000"), environ={})
    consumer = kafka_client_settings(cfg.kafka, "consumer")
    producer = kafka_client_settings(cfg.kafka, "producer")
    assert consumer["session_timeout_ms"] == 6000 and "session_timeout_ms" not in producer
    assert producer["acks"] == 1 and "acks" not in consumer
    assert consumer["request_timeout_ms"] == producer["request_timeout_ms"] == 9000  # both have it
    with pytest.raises(ConfigError, match="KafkaConsumer setting 'acks'"):
        with_values(cfg, {"kafka": {"consumer": {"acks": 1}}})


def test_the_transactional_producer_gives_up_on_a_batch_only_after_the_workers_waits_for_its_commit():
    """kafka-python fails a batch that outlives ``delivery_timeout_ms`` without failing its transaction, so the
    outcomes' producer must outlast the worker's two waits (offsets joined, commit) of ``worker.kafka_timeout_s``
    each: 3 minutes by default (kafka-python's 2 are only the two waits), and a shorter one is refused at load."""
    assert transaction_producer_settings(load(None, (), environ={}))["delivery_timeout_ms"] == 180_000
    assert "delivery_timeout_ms" not in kafka_client_settings(load(None, (), environ={}).kafka, "producer")
    shorter = load(None, ("worker.kafka_timeout_s=10",), environ={})
    assert transaction_producer_settings(shorter)["delivery_timeout_ms"] == 80_000
    given = load(None, ("kafka.delivery_timeout_ms=600000",), environ={})
    assert transaction_producer_settings(given)["delivery_timeout_ms"] == 600_000
    for too_short in ("kafka.delivery_timeout_ms=120000", "kafka.producer={delivery_timeout_ms=179999}"):
        with pytest.raises(ConfigError, match=r"delivery_timeout_ms = \d+ is below 180000 ms"):
            load(None, (too_short,), environ={})
    assert load(None, ("worker.kafka_timeout_s=30", "kafka.delivery_timeout_ms=120000"), environ={})
