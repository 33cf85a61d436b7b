"""A deployment whose band tables are split by key: K virtual shards in a deterministic epoch order.

Each of the ``count`` virtual shards (vshards), fixed at creation, is two
things at once (docs/pages/sharding.md, "Band tables split by key"):

- the *home* of the documents whose id hashes to it: their records, their
  content shingles, their ids (so replays and new versions are local);
- the *owner* of the band keys and content keys that hash to it: a band
  key's places (``lsh.cap = "probes"``: its first ``max_candidates``
  probers) and the first document of each content.

A document's keys go only to their owners, a candidate is verified where
its shingles live, and a document linked to another of its epoch is
decided by every vshard whose own documents wait for it. The stages of an epoch
are in ``vshard`` (what one vshard does with the messages of a stage),
where keys and documents live in ``placement``, a vshard's state in memory
in ``stores`` (in LMDB: ``store.vshardstate``), and ``simulator`` runs a
deployment in one process, delivering messages in an order drawn from a
seed. Decisions are ``engine.decide.decide_together``'s, the single worker's.
"""

from .message import Message
from .placement import homes_of, owners_of_contents, owners_of_slots

__all__ = ["Message", "VShard", "check_supported", "homes_of", "owners_of_contents", "owners_of_slots"]


def __getattr__(name: str):
    """``VShard`` and ``check_supported``, imported when first asked for: a signing process needs only
    ``placement`` and ``Message``, and ``vshard`` brings the engine (some 0.2 s of CPU at its start)."""
    if name in ("VShard", "check_supported"):
        from . import vshard

        return getattr(vshard, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
