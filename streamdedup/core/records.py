"""The nouns on the data path: where a record came from, a document, a rejection, a decision.

They are values: nothing changes them after they are made. They are not
frozen only because frozen dataclasses cost three times as much to build,
and several of them are built per document on the hot path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Union

__all__ = ["Source", "RawRecord", "FileBatch", "Document", "Rejected", "Decision", "Item", "KEPT", "DUPLICATE",
           "REJECTED", "canonical_order", "id_key"]

KEPT = "kept"
DUPLICATE = "duplicate"
REJECTED = "rejected"


@dataclass(slots=True)
class Source:
    """Where an input record came from: a topic partition offset, or a file line."""

    name: str  # topic, or file path ("-" for stdin)
    partition: int  # Kafka partition; -1 for files
    offset: int  # Kafka offset, or line number (from 1) in the file

    def as_list(self) -> list:
        return [self.name, self.partition, self.offset]

    def fallback_id(self) -> str:
        """The document id used when the record names none."""
        if self.partition < 0:
            return f"{self.name}:{self.offset}"
        return f"{self.name}/{self.partition}/{self.offset}"


@dataclass(slots=True)
class RawRecord:
    """One input record's bytes and where it came from."""

    value: Optional[bytes]
    source: Source
    key: Optional[bytes] = None
    headers: tuple = ()
    timestamp_ms: int = -1
    rejected: Optional[str] = None  # "reason: detail" when the record is rejected as it is read (see decode)


def canonical_order(records: list["RawRecord"]) -> list["RawRecord"]:
    """Records sorted by topic, partition, offset: the order a batch is decided in, and replayed in."""
    return sorted(records, key=lambda r: (r.source.name, r.source.partition, r.source.offset))


@dataclass
class FileBatch:
    """Consecutive lines of one input file, kept as the one block of bytes they were read as.

    Offline batches are not split into records here: the preparing process
    splits and decodes them, and the deciding process only needs the block
    (one cheap object to send) and, for the clean output, the lines.
    """

    path: str
    first_line: int  # line number of the block's first line (from 1)
    count: int  # lines in the block
    block: bytes  # the lines, each with its newline (the file's last line may lack it); b"" when they stayed in
    # the feed process (``runtime.feed.ProcessFeed``: the caller writes no clean output)
    format: str = "lines"  # "lines" (read by input.format), or "warc" (``runtime.warc``'s lines)

    def __len__(self) -> int:
        return self.count

    def values(self) -> list[bytes]:
        """Each line without its newline (a CR of CRLF stays)."""
        return self.block.split(b"\n")[: self.count]

    def sources(self) -> list[Source]:
        return [Source(self.path, -1, n) for n in range(self.first_line, self.first_line + self.count)]


@dataclass(slots=True)
class Document:
    """A decoded input record to deduplicate.

    ``decode`` makes one only of a text that is not blank; one whose text
    normalizes to nothing becomes a ``Rejected`` in ``prepare``. A document
    restored from a batch prepared in another process has ``text`` "": its
    text stayed there, and only its content hash and shingles came back.
    """

    id: str
    text: str
    source: Source
    url: Optional[str] = None  # the page's URL, when the record names one (``input.url_field``)


@dataclass(slots=True)
class Rejected:
    """An input record that cannot be deduplicated, and why (a reason code from ``decode``)."""

    reason: str
    detail: str
    source: Source
    id: Optional[str] = None

    def message(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


Item = Union[Document, Rejected]


@dataclass(slots=True)
class Decision:
    """The outcome of one document (``streamdedup.Decision`` in the Python API).

    ``status`` is "kept" (a new cluster), "duplicate" or "rejected" (with a
    ``reason``: "code: detail", the codes of ``decode``). ``cluster`` is the
    document id of the cluster's representative (for a kept document, its own
    id). ``matched`` is the document it was found to duplicate, ``similarity``
    the exact Jaccard of their content; ``exact`` says the normalized texts
    are identical. ``replayed`` says the index had already decided this very
    document (same id, same content) and this is that earlier decision.
    """

    id: str
    status: str  # KEPT, DUPLICATE or REJECTED
    cluster: Optional[str] = None
    matched: Optional[str] = None
    similarity: Optional[float] = None
    reason: Optional[str] = None
    exact: bool = False
    replayed: bool = False
    candidates: int = 0  # documents proposed by the band tables
    verified: int = 0  # exact Jaccard computations
    containment: Optional[float] = None  # an excerpt: the share of its content inside ``matched``

    @property
    def relation(self) -> Optional[str]:
        """How a duplicate relates to ``matched``: "exact", "near" or "excerpt" (None unless a duplicate)."""
        if self.status != DUPLICATE:
            return None
        if self.exact:
            return "exact"
        return "near" if self.containment is None else "excerpt"

    def as_json(self) -> dict:
        """The decision line of the offline command (``--decisions``); the duplicates topic has its own form."""
        return {
            "id": self.id,
            "status": self.status,
            "cluster": self.cluster,
            "matched": self.matched,
            "similarity": None if self.similarity is None else round(self.similarity, 6),
            "reason": self.reason,
            "relation": self.relation,
            "containment": None if self.containment is None else round(self.containment, 6),
        }

    @classmethod
    def rejected(cls, item: Rejected) -> "Decision":
        return cls(id=item.id or item.source.fallback_id(), status=REJECTED, reason=item.message())


def id_key(doc_id: str) -> bytes:
    """The index key of a document id: BLAKE2b-64 of its UTF-8 bytes (stable across processes and machines).

    Two ids may share a key (about once in 2^64 / n^2 for n ids), so a hit
    is compared with the record's id before it counts.
    """
    return hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
