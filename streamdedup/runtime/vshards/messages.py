"""What the internal topics of a deployment with band tables split by key carry.

- The **order topic** (``shards.signed_topic``, one partition) holds the
  decision order: an *epoch* message per stretch of the input a signing
  process read (no document's data: which input offsets it covers, how many
  records, and where each home's records are), and forget orders. Every
  vshard reads every one, so they are small.
- The **records topic** (``shards.signed_topic`` + ``-values``, a partition
  per vshard) holds a *home* message per epoch and vshard that is home to
  records of it: those records whole, each one's place in the epoch, and how
  the signing process decoded them (its ``[input]`` spec): the home decodes
  and prepares them itself. Only the home reads it.
- The **exchange topic** (``shards.evidence_topic``, a partition per vshard)
  holds the vshards' messages to each other (``engine.vshards.Message``),
  on the receiver's partition.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Union

import msgpack

from ...core.decode import InputSpec
from ...core.prepare import decode_raw, raw_payload, raw_records
from ...core.records import Item, RawRecord
from ...core.signed import ForgetOrder, pack_forget
from ...engine.vshards.message import Message
from ..sink.messages import kept_record_bytes

__all__ = ["Epoch", "Home", "ForgetOrder", "pack_epoch", "pack_home", "pack_forget", "unpack_order", "unpack_home",
           "pack_message", "unpack_message", "input_ranges", "kept_with_order", "KEYS_FORMAT"]

# The sharded deployment's messages: 1 and 2 were the signed batches of the deployment before; 4 sends the probes'
# and kept messages' serials as runs (``vshard._runs``), which a host of format 3 cannot read; 5 sends a home its
# records' bytes alone, which it decodes and prepares (format 4 sent what the signer prepared too, which a host of
# format 5 does not read, nor one of 4 these). An epoch of one is refused by the other's hosts.
KEYS_FORMAT = 5
ORDER_HEADER_BYTES = 64  # room for the ``streamdedup.order`` header a vshard adds to a kept record


@dataclass
class Epoch:
    """A stretch of the input in the decision order."""

    signed_at: float  # the decision time of every record of it, the same on every vshard
    fingerprint: str  # of the signing settings
    count: int  # records, so places ``first .. first + count`` in the order
    ranges: list[tuple[str, int, int, int]]  # (topic, partition, first offset, last offset) it read
    homes: dict[int, int] = field(default_factory=dict)  # vshard -> offset of its home message

    def fresh_after(self, next_offsets: dict) -> bool:
        """Whether it holds a record past ``next_offsets`` ((topic, partition) -> the next offset not yet
        taken), i.e. one not taken before (a signing process may read records again)."""
        return any(last >= next_offsets.get((topic, partition), 0) for topic, partition, _, last in self.ranges)


@dataclass
class Home:
    """One vshard's records of an epoch, whole, each one's place in the epoch, and how to decode them."""

    places: list[int]
    records: list[RawRecord]
    spec: InputSpec  # the signing process's: records too large for the clean topic are rejected as they decode

    def items(self) -> list[Item]:
        """The records decoded as the signing process decoded them to place them (``placement.homes_of_items``)."""
        return decode_raw(raw_payload(self.records), self.spec)


def input_ranges(payload: tuple) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (first offset, last offset) of the records of ``raw_payload`` columns: at once when
    they come from one partition (a signing process asks twice an epoch: its epoch messages, the group's offsets),
    else each partition's offsets gathered, then their least and greatest taken."""
    names, partitions, offsets = payload[4], payload[5], payload[6]
    if not offsets:
        return {}
    if names.count(names[0]) == len(names) and partitions.count(partitions[0]) == len(partitions):
        return {(names[0], partitions[0]): (min(offsets), max(offsets))}
    gathered: dict = {}
    for where, offset in zip(zip(names, partitions), offsets):
        gathered.setdefault(where, []).append(offset)
    return {where: (min(at), max(at)) for where, at in gathered.items()}


def pack_epoch(signed_at: float, fingerprint: str, count: int, ranges: dict, homes: dict[int, int]) -> bytes:
    """An epoch of ``count`` records read from ``ranges`` (``input_ranges``), its home messages at ``homes``."""
    return msgpack.packb([KEYS_FORMAT, "epoch", signed_at, fingerprint, count,
                          [[topic, partition, first, last] for (topic, partition), (first, last) in ranges.items()],
                          sorted(homes.items())], use_bin_type=True)


def unpack_order(data: bytes) -> Union[Epoch, ForgetOrder]:
    """An epoch or a forget order of the order topic; ValueError for anything else."""
    fields = msgpack.unpackb(data, use_list=True)
    if len(fields) >= 3 and fields[1] == "forget":
        return ForgetOrder(fields[2])
    if fields[:2] != [KEYS_FORMAT, "epoch"]:
        raise ValueError(f"not an epoch of format {KEYS_FORMAT}: {fields[:2]!r} (a deployment of another "
                         "version wrote this topic)")
    _, _, signed_at, fingerprint, count, ranges, homes = fields
    return Epoch(signed_at, fingerprint, count, [tuple(r) for r in ranges], dict(homes))


def pack_home(places: list[int], payload: tuple, spec: InputSpec) -> bytes:
    """A home message: the records of ``raw_payload`` columns, at ``places`` in their epoch, decoded with ``spec``."""
    return msgpack.packb([KEYS_FORMAT, "home", places, list(payload), _spec_fields(spec)], use_bin_type=True)


def unpack_home(data: bytes) -> Home:
    fields = msgpack.unpackb(data, use_list=True)
    if fields[:2] != [KEYS_FORMAT, "home"]:
        raise ValueError(f"not a home message of format {KEYS_FORMAT}: {fields[:2]!r} (a deployment of another "
                         "version wrote this topic)")
    _, _, places, payload, spec = fields
    payload[2] = [tuple(map(tuple, headers)) if headers else () for headers in payload[2]]  # most have none
    return Home(places, raw_records(tuple(payload)), _spec_of(spec))


def kept_with_order(*record) -> int:
    """A document's record size on the clean topic were it kept (``InputSpec.kept_bytes``), with room for the
    header a vshard adds."""
    return kept_record_bytes(*record) + ORDER_HEADER_BYTES


def _spec_fields(spec: InputSpec) -> dict:
    """``spec``'s settings (all but its measure of a kept record, ``kept_with_order`` wherever a limit is set)."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "kept_bytes"}


def _spec_of(fields: dict) -> InputSpec:
    return InputSpec(**fields, kept_bytes=kept_with_order if fields["max_output_bytes"] else None)


def pack_message(message: Message) -> bytes:
    return msgpack.packb([message.epoch, message.stage, message.sender, message.to, message.body],
                         use_bin_type=True)


def unpack_message(data: bytes) -> Message:
    return Message(*msgpack.unpackb(data, use_list=False))
