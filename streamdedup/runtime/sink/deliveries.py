"""Sends outside a transaction whose outcome something waits on: checked after the flush, before it moves.

kafka-python's ``KafkaProducer.flush`` returns once every record sent is
*done*, acknowledged or failed: it raises only when it times out. A record
the broker refused for good (no Write right, larger than its topic's
``max.message.bytes``) or that the producer gave up on (its
``delivery_timeout_ms`` ran out during an outage) is only logged by the
client. So whoever moves something that depends on its sends (the group's
offsets after an epoch, a vshard's commit) keeps their record futures and
checks them after the flush (``Deliveries``): the first failed one raises
``errors.lost_write``'s error, naming its topic, partition and the client's
error. A transactional producer needs none of this: a failed send puts its
transaction in error and its commit raises (``sink.producer.KafkaSink``).
"""

from __future__ import annotations

from typing import Iterable, Optional

from ...errors import lost_write

__all__ = ["Deliveries", "first_failure", "raise_if_lost", "flushed"]


def first_failure(futures: Iterable) -> Optional[tuple[str, Optional[int], BaseException]]:
    """(topic, partition, error) of the first of ``futures`` (kafka-python's ``FutureRecordMetadata``) that failed or,
    after a flush that returned, is not done; None: every one was acknowledged."""
    from kafka.errors import KafkaTimeoutError

    for future in futures:
        if future.succeeded():
            continue
        error = future.exception if future.is_done else KafkaTimeoutError("not acknowledged when the flush returned")
        topic, partition = _place(future)
        return topic, partition, error
    return None


def _place(future) -> tuple[str, Optional[int]]:
    """The topic and partition a record future's record went to (its produce future's, in kafka-python)."""
    tp = getattr(getattr(future, "_produce_future", None), "topic_partition", None)
    return ("?", None) if tp is None else (tp.topic, tp.partition)


def raise_if_lost(futures: Iterable, what: str, wanted_bytes: Optional[int] = None) -> None:
    """Raise ``lost_write``'s error for the first of ``futures`` that was not acknowledged (call after a flush)."""
    failed = first_failure(futures)
    if failed is not None:
        topic, partition, error = failed
        raise lost_write(what, topic, partition, error, wanted_bytes) from error


def flushed(producer, futures: list, what: str, wanted_bytes: Optional[int] = None,
            timeout: Optional[float] = None) -> None:
    """``producer.flush``, then ``raise_if_lost`` of ``futures``. A flush that raises (kafka-python 3.0.12 raises
    ``UnknownError('Future not done')`` once its sender has aborted every batch on an error it takes for fatal,
    such as a record its topic refuses as too large) is explained by the first future that failed, if one did:
    its error, not the flush's, says what to do (and whether trying again can help)."""
    try:
        producer.flush(timeout=timeout)
    except Exception as flush_error:
        failed = first_failure(future for future in futures if future.is_done)
        if failed is None:
            raise
        topic, partition, error = failed
        raise lost_write(what, topic, partition, error, wanted_bytes) from flush_error
    raise_if_lost(futures, what, wanted_bytes)


class Deliveries:
    """A producer's record futures not yet checked: ``flush`` waits for them all and raises for the first one the
    broker did not take (``raise_if_lost``), then forgets them. Checked once a flush, not once a record."""

    def __init__(self, producer, what: str, wanted_bytes: Optional[int] = None) -> None:
        """``what``: the records, as an error names one ("a vshard's message to another"); ``wanted_bytes``: the
        max.message.bytes their topics are made with."""
        self.producer = producer
        self.what = what
        self.wanted_bytes = wanted_bytes
        self.futures: list = []

    def add(self, future) -> None:
        self.futures.append(future)

    def flush(self, timeout: Optional[float] = None) -> None:
        """``KafkaProducer.flush``, then every future kept checked and forgotten (``flushed``)."""
        futures, self.futures = self.futures, []
        flushed(self.producer, futures, self.what, self.wanted_bytes, timeout)
