"""Elias-Fano coding of sorted unique 32-bit values: how the index stores a kept document's shingles.

A document's shingles are n sorted distinct values spread evenly over 2^32.
Elias-Fano splits each into its ``L = floor(log2(2^32 / n))`` low bits, kept
as they are, and its high bits, which rise and are written in unary: value
i sets bit ``(value >> L) + i`` of a bit array of at most ``3n`` bits. That is
``L + 2 + 1/n`` bits a value at most: about 3.3 bytes for the few hundred
shingles of a page instead of 4, and still exact (decoding gives back every
value), so verification compares the same sets.

Layout: one byte ``L``; n as LEB128; the n x L low bits, value after value,
least significant bit first; the high bits' array, least significant bit of
each byte first. The compiled kernel (``_kernel.c``) does both directions;
this module's numpy code is the same definition and runs without it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

try:
    from . import _kernel
except ImportError:  # built by ``pip install`` when a C compiler is there
    _kernel = None

__all__ = ["encode", "encode_many", "decode", "low_bits"]

_UNIVERSE = 1 << 32


def low_bits(n: int) -> int:
    """``L`` for n values: floor(log2(2^32 / n)), 0 for none."""
    return (_UNIVERSE // n).bit_length() - 1 if n > 0 else 0


def encode(values: np.ndarray) -> bytes:
    """The coding of sorted unique uint32 values (ValueError if they are not)."""
    values = np.ascontiguousarray(values, dtype=np.uint32)
    if _kernel is not None:
        return _kernel.ef_encode(values)
    return encode_numpy(values)


def encode_many(values: np.ndarray, offsets: np.ndarray, rows: Optional[np.ndarray] = None) -> list[bytes]:
    """The coding of each document's values, ``values[offsets[i]:offsets[i + 1]]``, in one call; with ``rows``,
    of the documents ``rows`` numbers only, in their order."""
    values = np.ascontiguousarray(values, dtype=np.uint32)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    documents = range(len(offsets) - 1) if rows is None else np.ascontiguousarray(rows, dtype=np.int64)
    if _kernel is not None:
        return _kernel.ef_encode_many(values, offsets, None if rows is None else documents)
    return [encode_numpy(values[offsets[i]:offsets[i + 1]]) for i in documents]


def decode(data: bytes) -> np.ndarray:
    """The sorted uint32 values of a coding (ValueError if ``data`` is not one)."""
    if _kernel is not None:
        return np.frombuffer(_kernel.ef_decode(data), dtype="<u4")
    return decode_numpy(data)


def _leb128(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_numpy(values: np.ndarray) -> bytes:
    n = len(values)
    v = values.astype(np.int64)
    if n > 1 and not bool(np.all(v[1:] > v[:-1])):
        raise ValueError("Elias-Fano codes sorted unique values only")
    low = low_bits(n)
    header = bytes([low]) + _leb128(n)
    if not n:
        return header
    bits = ((v[:, None] >> np.arange(low)) & 1).astype(np.uint8)
    lows = np.packbits(bits.ravel(), bitorder="little").tobytes()
    upper = np.zeros(int(v[-1] >> low) + n, dtype=np.uint8)
    upper[(v >> low) + np.arange(n)] = 1
    return header + lows + np.packbits(upper, bitorder="little").tobytes()


def decode_numpy(data: bytes) -> np.ndarray:
    if len(data) < 2 or data[0] > 32:
        raise ValueError("not an Elias-Fano coding of sorted unique uint32 values")
    low, n, at, shift = data[0], 0, 1, 0
    while True:
        if at >= len(data) or shift > 35:
            raise ValueError("not an Elias-Fano coding of sorted unique uint32 values")
        byte = data[at]
        at += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    low_bytes = (n * low + 7) // 8
    if n > len(data) * 8 or at + low_bytes > len(data) or low != low_bits(n):
        raise ValueError("not an Elias-Fano coding of sorted unique uint32 values")
    bits = np.unpackbits(np.frombuffer(data, np.uint8, low_bytes, at), bitorder="little")[:n * low]
    lows = bits.reshape(n, low).astype(np.int64) @ (np.int64(1) << np.arange(low, dtype=np.int64))
    ones = np.flatnonzero(np.unpackbits(np.frombuffer(data, np.uint8, offset=at + low_bytes), bitorder="little"))
    if len(ones) < n:
        raise ValueError("not an Elias-Fano coding of sorted unique uint32 values")
    values = ((ones[:n] - np.arange(n)) << low) | lows
    if (n and values[-1] >= _UNIVERSE) or (n > 1 and not bool(np.all(values[1:] > values[:-1]))):
        raise ValueError("not an Elias-Fano coding of sorted unique uint32 values")
    return values.astype("<u4")
