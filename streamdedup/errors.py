"""The one exception hierarchy of streamdedup.

Bad *input* is never an exception: it is a ``Rejected`` value with a reason
(see ``decode.py``). Exceptions are for situations an operator must act on::

    StreamdedupError                 base class; ``retriable`` says retry or stop
    ├── ConfigError                  config.toml, environment or --set is wrong
    ├── IndexUnusableError           the on-disk index cannot be used
    │   ├── IncompatibleIndexError   opened with another signing configuration
    │   ├── IndexLockedError         another process already writes this index
    │   ├── IndexCorruptError        the index is missing data it must have
    │   └── DiskFullError            the disk holding the index is full
    ├── ResumeError                  a checkpoint does not fit the inputs given
    └── BrokerError                  Kafka cannot be used as configured
        └── BrokerUnavailableError   the broker does not answer (retriable)

Every message says what was expected, what was found and what to do.
"""

from __future__ import annotations

from typing import Optional


class StreamdedupError(Exception):
    """Base class of every error streamdedup raises on purpose."""

    retriable = False


class ConfigError(StreamdedupError):
    """A configuration key is unknown, of the wrong type or out of range: fix the named key."""


class IndexUnusableError(StreamdedupError):
    """The on-disk index cannot be used as it is."""


class IncompatibleIndexError(IndexUnusableError):
    """The index was built with other signing settings: run with those or rebuild the index."""


class IndexLockedError(IndexUnusableError):
    """Another process writes this index: stop it, or use another state folder."""


class IndexCorruptError(IndexUnusableError):
    """The index lacks data it must have: run `streamdedup check`, restore a backup or rebuild."""


class DiskFullError(IndexUnusableError):
    """The disk holding the index is full: free space; the index stays as of the last commit."""


class ResumeError(StreamdedupError):
    """An interrupted run's checkpoint does not fit the inputs given now."""


class BrokerError(StreamdedupError):
    """Kafka cannot be used as configured."""


class BrokerUnavailableError(BrokerError):
    """The broker does not answer; the worker waits and retries."""

    retriable = True


def kafka_trouble(exc: BaseException) -> Optional[BaseException]:
    """A kafka-python error as a BrokerError (retriable or not), else None (not ours to handle)."""
    from kafka import errors

    fatal = (errors.ProducerFencedError, errors.TransactionalIdAuthorizationFailedError,
             errors.TopicAuthorizationFailedError, errors.GroupAuthorizationFailedError)
    if isinstance(exc, fatal):
        return BrokerError(f"{type(exc).__name__}: {exc}; another worker with the same transactional id "
                           "may have taken over, or the credentials lack rights")
    if isinstance(exc, (errors.KafkaError, errors.IllegalStateError, OSError)):
        return BrokerUnavailableError(f"{type(exc).__name__}: {exc}")
    return None
