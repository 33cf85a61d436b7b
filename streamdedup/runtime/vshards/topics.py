"""The internal topics of a sharded deployment (``messages``): the order (one partition), the records and the
exchange (one partition per vshard each)."""

from __future__ import annotations

from ...config import Config, kafka_client_settings
from ...errors import BrokerError
from ..sink.admin import admin_client, create_output_topics

__all__ = ["ensure_internal_topics", "values_topic", "SIGNED_MESSAGE_BYTES"]

SIGNED_MESSAGE_BYTES = 64 << 20  # the internal topics' max.message.bytes: a home message, or one large record, fits


def values_topic(config: Config) -> str:
    """The records topic, a partition per vshard: the order topic's name and ``-values``."""
    return f"{config.shards.signed_topic}-values"


def ensure_internal_topics(config: Config) -> list[str]:
    """Create the order, records and exchange topics if they are missing (and the output topics, with
    ``output.create_topics``); returns the ones made.

    Existing records and exchange topics must have one partition per vshard (``shards.count``), and the
    order topic one partition: otherwise the deployment was made with another count, which is refused.
    """
    from kafka.errors import TopicAlreadyExistsError, for_code

    shards = config.shards
    wanted = {shards.signed_topic: 1, values_topic(config): shards.count, shards.evidence_topic: shards.count}
    settings = kafka_client_settings(config.kafka, "admin")
    admin = admin_client(settings)
    try:
        existing = set(admin.list_topics())
        missing = [t for t in wanted if t not in existing]
        if missing:
            answer = admin.create_topics(
                {t: {"num_partitions": wanted[t], "replication_factor": config.output.replication_factor,
                     "configs": {"max.message.bytes": str(SIGNED_MESSAGE_BYTES)}} for t in missing},
                raise_errors=False)
            failed = [(t["name"], for_code(t["error_code"]).__name__) for t in answer["topics"]
                      if t["error_code"] and for_code(t["error_code"]) is not TopicAlreadyExistsError]
            if failed:
                raise BrokerError(f"cannot create the internal topics {failed}; create them yourself "
                                  f"({shards.signed_topic}: 1 partition, {values_topic(config)} and "
                                  f"{shards.evidence_topic}: {shards.count} partitions each, max.message.bytes "
                                  f"{SIGNED_MESSAGE_BYTES}) or grant "
                                  "CreateTopics")
            admin.wait_for_topics(missing, timeout_ms=30000)
        for described in admin.describe_topics(list(wanted)):
            name, partitions = described["name"], len(described.get("partitions") or ())
            if partitions != wanted[name]:
                raise BrokerError(f"topic {name} has {partitions} partitions, a deployment of {shards.count} "
                                  f"vshards needs {wanted[name]}: shards.count must stay what the deployment was "
                                  "made with (or use new internal topics and vshard folders)")
    finally:
        admin.close()
    out = config.output
    if out.create_topics:
        made, _ = create_output_topics(settings, config.input.topics,
                                       [out.clean_topic, out.duplicates_topic, out.dead_letter_topic],
                                       out.replication_factor)
        missing += made
    return missing
