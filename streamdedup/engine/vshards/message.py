"""One message between vshards, apart from ``vshard`` so that a signing process reads and writes the internal
topics without importing the engine."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Message"]


@dataclass(frozen=True)
class Message:
    """One message between vshards: deterministic, so a copy delivered twice is the same message."""

    epoch: int
    stage: str
    sender: int
    to: int
    body: bytes  # msgpack
