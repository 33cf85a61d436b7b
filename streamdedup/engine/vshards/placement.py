"""Where a document lives and where a key is answered, among ``count`` virtual shards.

Stable across processes and machines (never Python's ``hash``): a document's
home is its id hash's (``records.id_key``) last 4 bytes modulo ``count`` (a
record rejected without an id, the hash of where it came from); a band slot
(``lsh.band_slots``) and a content hash are mixed by a fixed multiplier
first, so keys spread over vshards whatever their bits.
"""

from __future__ import annotations

import numpy as np

from ...core.decode import InputSpec
from ...core.prepare import decode_raw, id_keys_of, json_id_keys
from ...core.records import Item

__all__ = ["home_of", "homes_of", "homes_of_items", "homes_of_records", "owners_of_slots", "owners_of_contents"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: a multiplier that spreads every bit upwards


def home_of(ident: bytes, count: int) -> int:
    """The home vshard of the documents with id hash ``ident`` (every version of an id has one home)."""
    return int.from_bytes(ident[-4:], "big") % count


def homes_of(id_keys: list[bytes], count: int) -> np.ndarray:
    """``home_of`` of each id hash (8 bytes, as ``records.id_key`` makes them; others one by one)."""
    joined = b"".join(id_keys)
    if len(joined) != 8 * len(id_keys):
        return np.array([home_of(ident, count) for ident in id_keys], dtype=np.int64)
    return np.frombuffer(joined, dtype=">u4")[1::2].astype(np.int64) % count


def homes_of_items(items: list[Item], count: int) -> np.ndarray:
    """The home of each decoded record, which prepares, stores and sends it out: its id's (a document's, or a
    record rejected with an id), else the place it came from's, so every signing process agrees on it whatever
    else its batch holds. Every version of an id has one home; a record that decodes to a document whose text
    normalizes to nothing is rejected at that home, which is its id's."""
    return homes_of(id_keys_of([_placed_by(item) for item in items]), count)


def homes_of_records(payload: tuple, spec: InputSpec, count: int) -> np.ndarray:
    """``homes_of_items`` of the records of ``raw_payload`` columns decoded with ``spec`` (the signer's
    ``InputSpec.placing``), most without decoding them: a JSON record's id key is found in its bytes by the kernel
    (``prepare.json_id_keys``), and only the others are decoded (the same homes: tested against decoding)."""
    keys = json_id_keys(payload, spec)
    unsure = [i for i, key in enumerate(keys) if key is None]
    if unsure:
        items = decode_raw(tuple([column[i] for i in unsure] for column in payload), spec)
        for i, key in zip(unsure, id_keys_of([_placed_by(item) for item in items])):
            keys[i] = key
    return homes_of(keys, count)


def _placed_by(item: Item) -> str:
    """What a decoded record is placed by: its id, else the place it came from."""
    return item.id if item.id is not None else f"{item.source.name}:{item.source.partition}:{item.source.offset}"


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
