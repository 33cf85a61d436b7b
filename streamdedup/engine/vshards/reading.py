"""A key-split deployment's vshard states read as one index: the parts of ``query`` that depend on where keys live.

A vshard's state holds, for its own documents, what one index holds for
all of them (records, shingles, ids and members, in the index's formats),
so ``engine.query``'s ``cluster_in`` and ``engine.explain``'s ``explain_in``
read it as they read one index, through a ``VShardReader``.
A query asks what one index answers from its band and content tables,
which are split by key here: each band key's holders from the key's owner
(``holders_across``) and a content's first document from the content's
owner (``first_document``); each candidate is then verified at its home,
by ``engine.query``'s own rules.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from ...config import Config
from ...core.templates import TemplateSettings
from ...store.index import IndexTxn
from ...store.vshardstate import StoredVShard
from ..settings import DedupSettings
from .placement import owners_of_contents, owners_of_slots
from .stores import holder_homes, holder_serials

__all__ = ["VShardReader", "holders_across", "first_document"]


class VShardReader:
    """A vshard's state opened read-only, as the read-only questions take an index (``query.Readable``): its
    tables, and the settings the deployment decides with, stored with the state (signing, threshold, cap;
    ``config`` gives the rest, as to ``Engine``), so a query is signed and judged as the deployment's
    documents were, whatever config the reader is given."""

    def __init__(self, config: Config, path: str):
        self.state = StoredVShard(path)
        self.index = self.state.index
        self.signing = self.index.signing
        identity = self.state.identity
        self.settings = dataclasses.replace(DedupSettings.of(config, self.signing), threshold=identity["threshold"],
                                            max_candidates=identity["max_candidates"])
        self.template_settings = TemplateSettings.from_fingerprint(self.signing.templates)

    @property
    def place(self) -> list[int]:
        """[number, count]: which vshard of how many the state is."""
        identity = self.state.identity
        return [identity["number"], identity["count"]]

    def close(self) -> None:
        self.state.close()


def holders_across(readers: Sequence[VShardReader], txns: Sequence[IndexTxn],
                   slots: np.ndarray) -> dict[int, int]:
    """Serial -> home of every document holding a place under these sorted unique band slots, each slot asked
    of its owner (``readers[n]`` read in ``txns[n]``), in serial order."""
    owners = owners_of_slots(slots, len(readers))
    found = [reader.state.holders(txn, slots[owners == number])
             for number, (reader, txn) in enumerate(zip(readers, txns))]
    holders = np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
    return dict(zip(holder_serials(holders).tolist(), holder_homes(holders).tolist()))


def first_document(readers: Sequence[VShardReader], txns: Sequence[IndexTxn],
                   content: bytes) -> Optional[tuple[int, int]]:
    """(serial, home) of the first document with ``content``, asked of the content's owner; None if none."""
    owner = int(owners_of_contents([content], len(readers))[0])
    first = readers[owner].state.first_of(txns[owner], content)
    return None if first is None else (first[0], first[1])
