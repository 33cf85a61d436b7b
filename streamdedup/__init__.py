"""streamdedup: streaming, incremental near-duplicate deduplication of text.

Data path, one module per stage: ``source`` -> ``prepare`` (``decode``,
``shingle``, ``signing``, ``lsh``) -> ``decide`` (``index``, ``view``,
``candidates``, ``verify``) -> ``sink``;
``checkpoint`` holds the commit protocols, ``engine`` ties index and
settings together, ``offline`` and ``worker`` are the two loops, ``api``
is the Python API (``streamdedup.open``).

The API's names are loaded on first use, so ``import streamdedup`` stays
cheap (no numpy, no LMDB) for the command line and for preparing processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["open", "open_shards", "Index", "ShardedIndex", "Decision", "Match", "ClusterView", "Explanation",
           "ForgetReport", "CheckReport", "StreamdedupError", "IndexLockedError", "UnknownDocumentError", "__version__"]

_FROM = {name: "api" for name in ("open", "open_shards", "Index", "ShardedIndex", "Decision", "Match",
                                  "ClusterView", "Explanation", "ForgetReport", "CheckReport")}
_FROM.update({name: "errors" for name in ("StreamdedupError", "IndexLockedError", "UnknownDocumentError")})

if TYPE_CHECKING:
    from .api import (CheckReport, ClusterView, Decision, Explanation, ForgetReport, Index, Match, ShardedIndex,
                      open, open_shards)
    from .errors import IndexLockedError, StreamdedupError, UnknownDocumentError


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module 'streamdedup' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{_FROM[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
