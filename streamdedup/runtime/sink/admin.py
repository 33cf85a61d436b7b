"""The output topics as the broker has them: their size limits, and creating the missing ones."""

from __future__ import annotations

__all__ = ["admin_client", "topic_limits", "create_output_topics", "KAFKA_DEFAULT_MAX_MESSAGE_BYTES"]

KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1048588  # a topic's max.message.bytes when neither it nor the broker sets one


def admin_client(client_settings: dict):
    """A kafka-python admin client with those of ``client_settings`` (``config.kafka_client_settings``) it takes."""
    from kafka import KafkaAdminClient

    from ..fetch import metadata_paced_as_configured

    metadata_paced_as_configured()
    return KafkaAdminClient(**{k: v for k, v in client_settings.items() if k in KafkaAdminClient.DEFAULT_CONFIG})


def topic_limits(client_settings: dict, topics: list[str]) -> dict:
    """Each topic's ``max.message.bytes`` (the broker's default where the topic sets none), asked of the broker.

    A record larger than this is refused by the broker, at every retry: the
    worker rejects such records before deciding them (clean topic) or cuts
    them to fit (dead letters) instead. Needs DescribeConfigs on the topics.
    """
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.errors import AuthorizationError

    admin = admin_client(client_settings)
    try:
        found = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t, ["max.message.bytes"])
                                        for t in topics], config_filter="all")
    except AuthorizationError as exc:
        from ...errors import BrokerError

        raise BrokerError(f"cannot read the output topics' max.message.bytes ({type(exc).__name__}); grant the "
                          "worker's user DescribeConfigs on them (see docs/pages/worker.md: Pointing the worker at an "
                          "existing cluster)") from None
    finally:
        admin.close()
    described = found.get("topic", {})
    hidden = [t for t in topics if t in described and not described[t]]
    if hidden:
        raise _describe_configs_refused(client_settings, hidden)
    return {t: int(described.get(t, {}).get("max.message.bytes", {}).get("value", KAFKA_DEFAULT_MAX_MESSAGE_BYTES))
            for t in topics}


def create_output_topics(client_settings: dict, input_topics: list[str], output_topics: list[str],
                         replication_factor: int) -> tuple[list[str], int]:
    """Create the missing ``output_topics`` (``output.create_topics``): (the topics created, their partitions).

    They get the most partitions of any input topic; ``replication_factor`` -1
    takes the broker's ``default.replication.factor``. Nothing is created while no
    input topic exists (the start then stops on that, more clearly). Waits until
    every new partition has a leader. Needs Describe and CreateTopics: a topic
    the broker refuses is a ``BrokerError`` that says what to do; an unreachable
    broker raises kafka-python's own error (the worker waits and tries again).
    """
    from kafka.errors import TopicAlreadyExistsError, for_code

    from ...errors import BrokerError

    admin = admin_client(client_settings)
    try:
        existing = set(admin.list_topics())
        missing = [t for t in dict.fromkeys(output_topics) if t and t not in existing]
        inputs = [t for t in input_topics if t in existing]
        if not missing or not inputs:
            return [], 0
        partitions = max(len(t.get("partitions") or ()) for t in admin.describe_topics(inputs)) or 1
        answer = admin.create_topics({t: {"num_partitions": partitions, "replication_factor": replication_factor}
                                      for t in missing}, raise_errors=False)
        failed = [(t["name"], for_code(t["error_code"]), t.get("error_message")) for t in answer["topics"]
                  if t["error_code"] and for_code(t["error_code"]) is not TopicAlreadyExistsError]
        if failed:
            reasons = "; ".join(f"{name}: {error.__name__}" + (f" ({message})" if message else "")
                                for name, error, message in failed)
            raise BrokerError(f"cannot create the output topics ({reasons}); create them yourself, grant the "
                              "worker's user CreateTopics, or check output.replication_factor against the "
                              "number of brokers")
        admin.wait_for_topics(missing, timeout_ms=30000)
        return missing, partitions
    finally:
        admin.close()


def _describe_configs_refused(client_settings: dict, topics: list[str]):
    """The broker described no setting of these topics: the user lacks DescribeConfigs on them."""
    from ..rights import Right, Rights

    rights = Rights.of(client_settings, [], topics, "", None)
    return rights.refused("DescribeConfigs", [Right("DescribeConfigs", "topic", t) for t in topics],
                          hint=" (the worker reads the output topics' max.message.bytes at start)")
