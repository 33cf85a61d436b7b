"""The one exception hierarchy of streamdedup.

Bad *input* is never an exception: it is a ``Rejected`` value with a reason
(see ``decode.py``). Exceptions are for situations an operator must act on::

    StreamdedupError                 base class; ``retriable`` says retry or stop
    ├── ConfigError                  config.toml, environment or --set is wrong
    ├── IndexUnusableError           the on-disk index cannot be used
    │   ├── IncompatibleIndexError   opened with another signing configuration
    │   ├── IndexLockedError         another process already writes this index
    │   ├── IndexCorruptError        the index is missing data it must have
    │   ├── IndexFullError           the index has numbered all the documents it can
    │   └── DiskFullError            the disk holding the index is full
    ├── ResumeError                  a checkpoint does not fit the inputs given
    ├── UnknownDocumentError         no document with the id asked about (also a LookupError)
    ├── MissingExtraError            a command needs an optional extra that is not installed
    └── BrokerError                  Kafka cannot be used as configured
        └── BrokerUnavailableError   the broker does not answer (retriable)
            ├── TransactionFencedError  a Kafka transaction did not land: the session starts again (retriable)
            │   └── GroupMovedError     refused for a consumer group's old generation: it starts again at once
            └── WriteLostError      a send the broker never took (``lost_write``): the session starts again

``kafka_trouble`` sorts every error met while reading, deciding and writing
into transient (retried), permanent for one record (rejected with a reason)
and permanent for the worker (a message and exit 1); see its docstring.

Every message says what was expected, what was found and what to do.
"""

from __future__ import annotations

from typing import Optional


class StreamdedupError(Exception):
    """Base class of every error streamdedup raises on purpose."""

    retriable = False


class ConfigError(StreamdedupError):
    """A configuration key is unknown, of the wrong type or out of range: fix the named key."""


class UnknownDocumentError(StreamdedupError, LookupError):
    """The index holds no document with the id asked about (never added, or forgotten)."""


class IndexUnusableError(StreamdedupError):
    """The on-disk index cannot be used as it is."""


class IncompatibleIndexError(IndexUnusableError):
    """The index was built with other signing settings: run with those or rebuild the index."""


class IndexLockedError(IndexUnusableError):
    """Another process writes this index: stop it, or use another state folder."""


class IndexCorruptError(IndexUnusableError):
    """The index lacks data it must have: run `streamdedup check`, restore a backup or rebuild."""


class IndexFullError(IndexUnusableError):
    """The index has numbered all the documents it can (2^32, or as many as its band table's 512 runs of serials
    hold, about 2.4 billion): start a new index (or shard the input)."""


class DiskFullError(IndexUnusableError):
    """The disk holding the index is full: free space; the index stays as of the last commit."""


class ResumeError(StreamdedupError):
    """An interrupted run's checkpoint does not fit the inputs given now."""


class MissingExtraError(StreamdedupError):
    """A command needs an optional extra (``pip install 'streamdedup[EXTRA]'``) that is not installed."""


class BrokerError(StreamdedupError):
    """Kafka cannot be used as configured."""


class BrokerUnavailableError(BrokerError):
    """The broker does not answer; the worker waits and retries."""

    retriable = True


class TransactionFencedError(BrokerUnavailableError):
    """A Kafka transaction did not land although the client may say it did: the broker aborted it (the process
    was paused past ``transaction_timeout_ms``) or a newer producer fenced it. Retriable: the session is thrown
    away, nothing of the batch is committed anywhere else, and the next session's recovery finds what Kafka
    has."""


class GroupMovedError(TransactionFencedError):
    """A Kafka transaction's offsets refused for an old generation of their consumer group (KIP-447): the group
    moved partitions since the process last looked. The broker answers: the session starts again at once
    (``sessions.SessionLoop``), with backoff only if the session before it was refused so too without committing
    anything (a group that keeps moving).

    ``session_committed``: whether the refused session had committed anything before (set by its role)."""

    session_committed = False


class WriteLostError(BrokerUnavailableError):
    """A record sent outside a transaction that the broker never took, for a reason time may cure (the producer's
    ``delivery_timeout_ms`` ran out during an outage, a partition without a leader as long): nothing that
    depends on it was moved (offsets, a commit), so the session is thrown away and the next one starts again
    from the committed state. Made by ``lost_write``, which stops the process instead (``BrokerError``) where
    waiting cannot help (no Write right, a record larger than its topic takes)."""


# What a kafka-python error means for the worker (see ``kafka_trouble``), by class name so this
# module imports nothing heavy. Permanent for the worker: waiting cannot help, an operator must act.
_FATAL_FOR_WORKER = {
    "ProducerFencedError": "another worker with the same transactional id took over; run one worker per index",
    "TransactionCoordinatorFencedError": "another worker with the same transactional id took over; "
                                         "run one worker per index",
    "AuthorizationError": "the credentials lack a right the worker needs; see the ACLs in deploy/README.md "
                          "(Least privilege)",
    "SaslAuthenticationFailedError": "the broker refused the SASL credentials; fix kafka.sasl_*",
    "UnsupportedSaslMechanismError": "the broker does not offer this SASL mechanism; fix kafka.sasl_mechanism",
    "UnsupportedVersionError": "the broker is too old for what the worker asks (transactions need Kafka 0.11 "
                               "or later)",
    "UnsupportedForMessageFormatError": "the topic's message format is too old for transactions; "
                                        "use message format v2 (Kafka 0.11 or later)",
    "KafkaConfigurationError": "a kafka-python setting is wrong; fix the [kafka] section",
    "InvalidTopicError": "a topic name is not valid; fix input.topics or the [output] section",
    "InvalidTransactionTimeoutError": "transaction_timeout_ms is above the broker's "
                                      "transaction.max.timeout.ms; lower it in [kafka.producer]",
    "PolicyViolationError": "a broker policy refused the request; ask the cluster's operators",
    "MessageSizeTooLargeError": "a record was larger than its output topic accepts (was max.message.bytes "
                                "lowered while the worker ran?); start the worker again: it reads the "
                                "limits at start and rejects such records as too_large_for_output",
    "RecordListTooLargeError": "a batch was larger than the output topic accepts; start the worker again",
    "InvalidRecordError": "the broker refused a record the worker wrote (a topic policy or a compacted "
                          "output topic that needs keys?); check the output topics' settings",
}


def kafka_trouble(exc: BaseException) -> Optional[StreamdedupError]:
    """What an error met while reading, deciding or writing means: a StreamdedupError, or None (a bug: let it rise).

    Every error sorts into one of three kinds:

    - **transient**, ``retriable = True`` (``BrokerUnavailableError``): the
      worker drops its session, logs ``broker_lost`` with what it waits for,
      waits with backoff and starts a new session (see ``worker.WorkerLoop``;
      with ``--until-caught-up`` it gives up after
      ``worker.unreachable_timeout_s``). These are: our own errors marked
      retriable (the feed process could not read, the broker does not
      answer); kafka-python errors marked ``retriable`` (timeouts, lost
      connections, leader and coordinator changes, ``NoBrokersAvailable``
      at start); other kafka-python errors not named below, and
      ``IllegalStateError`` and ``OSError``, which a fresh session (a new
      producer that aborts the open transaction) gets past: an invalid
      producer epoch, an unknown producer id, an aborted transaction.
    - **permanent for one record**: never raised up to here. A record that
      cannot be read (``CorruptRecordError``: a failed checksum) is skipped
      by offset and rejected as ``unreadable_record`` (``source.KafkaSource``);
      one with a header key that is not UTF-8 is read anyway (``wire``) and
      rejected as ``invalid_header``; a record that would not
      fit its output topic is rejected before it is decided
      (``too_large_for_output``, ``decode``) or cut to fit (dead letters,
      ``sink``); bad bytes are ``Rejected`` values (``decode``).
    - **permanent for the worker**, ``retriable = False``: our own errors not
      marked retriable (configuration, index, a missing topic) and the
      kafka-python errors of ``_FATAL_FOR_WORKER`` (fenced, not
      authorized, authentication, versions, sizes the limits read at start
      should have prevented). The worker stops with a message saying what
      to do, and exits 1.
    """
    if isinstance(exc, StreamdedupError):
        return exc
    from kafka import errors

    if isinstance(exc, errors.KafkaError) and not getattr(exc, "retriable", False):
        advice = _fatal_advice(exc)
        if advice is not None:
            return BrokerError(f"{type(exc).__name__}: {exc}; {advice}")
    if isinstance(exc, (errors.KafkaError, OSError)):
        return BrokerUnavailableError(f"{type(exc).__name__}: {exc}")
    return None


# What to do about a send that failed for good, by kafka-python error class name (``lost_write``).
_LOST_WRITE_ADVICE = {
    "AuthorizationError": "grant the principal this process connects as WRITE on topic {topic} (see the ACLs in "
                          "deploy/README.md, Least privilege)",
    "MessageSizeTooLargeError": "raise max.message.bytes of topic {topic}{to} (kafka-configs.sh --alter "
                                "--entity-type topics --entity-name {topic} --add-config max.message.bytes=...)",
    "RecordListTooLargeError": "raise max.message.bytes of topic {topic}{to} (kafka-configs.sh --alter "
                               "--entity-type topics --entity-name {topic} --add-config max.message.bytes=...)",
}


def lost_write(what: str, topic: str, partition: Optional[int], exc: BaseException,
               wanted_bytes: Optional[int] = None) -> StreamdedupError:
    """The error for ``what`` ("an epoch message") sent to ``partition`` of ``topic`` outside a transaction that
    failed with kafka-python's ``exc`` (after a flush: ``flush`` does not raise for it): ``WriteLostError``
    (retriable: a new session) where ``kafka_trouble`` says waiting may help, else ``BrokerError`` saying what to
    do (``wanted_bytes``: the max.message.bytes the topic should have, if known)."""
    text = str(exc)
    named = text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"
    found = f"{what} to {topic}{'' if partition is None else f' partition {partition}'} was not written " \
            f"({named}); nothing that depends on it was committed"
    advice = write_advice(exc, topic, wanted_bytes)
    if advice is None:
        return WriteLostError(f"{found}; it may pass (a broker away for longer than the producer's "
                              "delivery_timeout_ms?): a session starts again from the committed state; if this "
                              "recurs, look at the broker's health, or raise delivery_timeout_ms in [kafka.producer]")
    return BrokerError(f"{found}; {advice}, then start the process again")


def write_advice(exc: BaseException, topic: str, wanted_bytes: Optional[int] = None) -> Optional[str]:
    """What to do about a send to ``topic`` that failed with ``exc``, where waiting cannot help (``kafka_trouble``
    sorts it so); None: it may pass by itself (a timeout, a lost connection)."""
    trouble = kafka_trouble(exc)
    if trouble is None or trouble.retriable:
        return None
    advice = _advice_for(exc, _LOST_WRITE_ADVICE)
    if advice is None:
        return _fatal_advice(exc) or str(trouble)
    return advice.format(topic=topic, to="" if wanted_bytes is None else f" to {wanted_bytes}")


def _advice_for(exc: BaseException, table: dict) -> Optional[str]:
    """The advice of ``table`` for the first class of ``exc``'s MRO it names, or None."""
    for cls in type(exc).__mro__:
        if cls.__name__ in table:
            return table[cls.__name__]
    return None


def _fatal_advice(exc: BaseException) -> Optional[str]:
    """What to do about a kafka-python error that waiting cannot cure, or None if it is not one."""
    return _advice_for(exc, _FATAL_FOR_WORKER)
