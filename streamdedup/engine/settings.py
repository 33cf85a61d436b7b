"""What a decision depends on besides the input order: the ``[lsh]``, ``[index]`` and ``[excerpts]`` settings."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.signing import SigningConfig

__all__ = ["DedupSettings", "ExcerptSettings"]


@dataclass(frozen=True)
class ExcerptSettings:
    """The ``[excerpts]`` section (``sampling`` 0: off)."""

    sampling: int = 0  # one content shingle in this many is an anchor
    containment: float = 0.8  # share of a document's content inside the earlier one
    min_shingles: int = 50  # documents with less content are never excerpts
    max_postings: int = 32  # documents an anchor holds
    anchor_share: float = 0.5  # candidates hold at least this share of the document's anchors
    max_sources: int = 10  # candidates verified per document


@dataclass(frozen=True)
class DedupSettings:
    signing: SigningConfig
    threshold: float = 0.7  # exact Jaccard at or above which a document is a duplicate
    max_candidates: int = 100  # verify at most this many candidates per document
    retention_s: float = 0.0  # kept documents older than this match nothing (0: forever)
    excerpts: ExcerptSettings = ExcerptSettings()

    @classmethod
    def of(cls, config, signing: SigningConfig) -> "DedupSettings":
        """The settings of ``config`` (a ``config.Config``) for an index signed with ``signing``."""
        excerpts = config.excerpts
        return cls(signing, config.lsh.threshold, config.lsh.max_candidates, config.index.retention_days * 86400.0,
                   ExcerptSettings(signing.excerpt_sampling, excerpts.containment, excerpts.min_shingles,
                                   excerpts.max_postings))
