"""Pure parts of the Kafka sink: the partition of each keyed outcome."""

from __future__ import annotations

import random

import pytest
from kafka.partitioner.default import murmur2

from streamdedup.sink import key_partitions


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 64])
def test_key_partitions_match_the_default_partitioner(partitions):
    rng = random.Random(partitions)
    keys = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 41))) for _ in range(3000)]
    keys += [b"", b"a", b"ab", b"abc", b"abcd", "\u00e9\u6f22-doc".encode(), b"\x00" * 9]
    expected = [(murmur2(k) & 0x7FFFFFFF) % partitions for k in keys]
    assert key_partitions(keys, partitions).tolist() == expected


def test_key_partitions_of_no_keys():
    assert key_partitions([], 5).tolist() == []
