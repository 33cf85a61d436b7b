"""Kafka's default partitioner for a whole batch of keys at once."""

from __future__ import annotations

import numpy as np

__all__ = ["key_partitions"]


def key_partitions(keys: list[bytes], partitions: int) -> np.ndarray:
    """The partition index Kafka's default partitioner gives each key: murmur2(key) & 0x7fffffff mod count.

    The same murmur2 as the Java and kafka-python clients, for all keys at
    once: key bytes laid out in rows of little-endian 32-bit words.
    """
    if partitions == 1 or not keys:
        return np.zeros(len(keys), dtype=np.int64)
    m = np.uint32(0x5BD1E995)
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    width = (int(lengths.max()) // 4 + 1) * 4  # room for every word and tail
    grid = np.zeros((len(keys), width), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    rows = np.repeat(np.arange(len(keys)), lengths)
    grid[rows, np.arange(len(rows)) - np.repeat(starts, lengths)] = np.frombuffer(b"".join(keys), dtype=np.uint8)
    words = grid.view("<u4").astype(np.uint32)
    full = lengths // 4
    h = np.uint32(0x9747B28C) ^ lengths.astype(np.uint32)
    for i in range(words.shape[1]):
        k = words[:, i] * m
        k ^= k >> np.uint32(24)
        k *= m
        h = np.where(full > i, (h * m) ^ k, h)
    at, extra, zero = np.arange(len(keys)), lengths % 4, np.uint32(0)

    def tail_byte(offset: int) -> np.ndarray:  # byte ``offset`` after the last whole word
        return grid[at, np.minimum(full * 4 + offset, width - 1)].astype(np.uint32)

    h ^= np.where(extra >= 3, tail_byte(2) << np.uint32(16), zero)
    h ^= np.where(extra >= 2, tail_byte(1) << np.uint32(8), zero)
    h = np.where(extra >= 1, (h ^ tail_byte(0)) * m, h)
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return (h & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions
