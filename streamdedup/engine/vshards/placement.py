"""Where a document lives and where a key is answered, among ``count`` virtual shards.

Stable across processes and machines (never Python's ``hash``): a document's
home is its id hash's (``records.id_key``) last 4 bytes modulo ``count``, as
the shards of today's deployment place documents; a band slot (``lsh.band_slots``)
and a content hash are mixed by a fixed multiplier first, so keys spread over
vshards whatever their bits.
"""

from __future__ import annotations

import numpy as np

from ..evidence import owners_of

__all__ = ["homes_of", "owners_of_slots", "owners_of_contents"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: a multiplier that spreads every bit upwards


def homes_of(id_keys: list[bytes], count: int) -> np.ndarray:
    """The home vshard of each document, by its id hash (every version of an id has one home)."""
    return owners_of(id_keys, count)


def owners_of_slots(slots: np.ndarray, count: int) -> np.ndarray:
    """The vshard owning each band slot."""
    return _spread(np.asarray(slots, dtype=np.uint64), count)


def owners_of_contents(contents: list[bytes], count: int) -> np.ndarray:
    """The vshard owning each content hash (its first 8 bytes decide)."""
    heads = np.array([int.from_bytes(content[:8].ljust(8, b"\0"), "little") for content in contents],
                     dtype=np.uint64)
    return _spread(heads, count)


def _spread(values: np.ndarray, count: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        mixed = values * _GOLDEN
    return ((mixed >> np.uint64(32)) % np.uint64(count)).astype(np.int64)
