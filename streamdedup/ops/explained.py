"""An ``Explanation`` for a terminal: the decision, the figures, then the passages side by side."""

from __future__ import annotations

import textwrap
from datetime import datetime, timezone
from itertools import zip_longest
from typing import Optional

from ..engine.explain import Explanation, Passage, Side

__all__ = ["explanation_lines"]

SAME_WORDS_SHOWN = 12  # a long passage the two texts share shows this many words at each end
_MARKS = {"same": "=", "changed": "~", "only_a": "-", "only_b": "+"}


def explanation_lines(explained: Explanation, width: int = 100) -> list[str]:
    """The lines ``streamdedup explain`` prints, wrapped to ``width`` columns (at least 40)."""
    width = max(width, 40)
    a, b = explained.a, explained.b
    lines = [_headline(explained)]
    lines.append(f"  A {_where(a)}")
    if b is not None:
        lines.append(f"  B {_where(b)}")
    if explained.decided_similarity is not None:
        decided = f"similarity {explained.decided_similarity:.6f} with {explained.matched} (threshold {explained.threshold})"
        if explained.decided_containment is not None:
            decided += f", containment {explained.decided_containment:.6f}"
        lines.append(f"  decided      {decided}")
    if explained.similarity is not None and b is not None:
        lines.append(f"  now          similarity {explained.similarity:.6f}: {explained.shared_shingles:,} content "
                     f"shingles shared, A {a.shingles:,} ({a.shingles_from}), B {b.shingles:,} ({b.shingles_from}); "
                     f"A inside B {explained.containment:.6f}")
    if explained.own_text_similarity is not None:
        lines.append(f"  own text     similarity {explained.own_text_similarity:.6f}: A without the text its site "
                     "repeats, against B (a decision takes the higher)")
    if explained.excerpt_text_containment is not None:
        lines.append(f"  excerpt text A inside B {explained.excerpt_text_containment:.6f}: A without the short lines' "
                     "text its site repeats (its navigation), as an excerpt of another site's page is measured "
                     "(a decision takes the higher)")
    if explained.shared_bands is not None:
        lines.append("  bands        " + _bands(explained))
    if explained.members is not None:
        lines.append(f"  cluster      {explained.members:,} duplicate(s) joined it")
    lines += [f"  note: {note}" for note in explained.notes]
    if explained.passages is not None:
        lines += _passages(explained.passages, a, b, width)
    return lines


def _headline(explained: Explanation) -> str:
    a = explained.a
    if a.status == "kept":
        return f"{a.id}: kept, the representative of its own cluster" + (
            "" if explained.b is None else f"; compared with {explained.b.id}")
    relation = {"exact": "an exact copy (the same normalized text, found by its content hash) of",
                "near": "a near duplicate of", "excerpt": "an excerpt (most of its content is inside) of"}
    cluster = f", in cluster {a.cluster}" if a.cluster else ", in no cluster now (its representative was forgotten)"
    line = f"{a.id}: duplicate, {relation.get(explained.relation or '', 'a duplicate of')} {explained.matched}{cluster}"
    if explained.b is not None and not explained.b_is_match:
        line += f"; compared with {explained.b.id}"
    return line


def _where(side: Side) -> str:
    when = datetime.fromtimestamp(side.time, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = side.source[0] + (f":{side.source[2]}" if side.source[1] < 0 else f"/{side.source[1]}/{side.source[2]}")
    return f"{side.id}: {side.status}, decided {when}, from {source}"


def _bands(explained: Explanation) -> str:
    shared = explained.shared_bands or []
    enough = len(shared) >= explained.min_shared
    verdict = ("enough to be a candidate" if enough else "too few to be a candidate")
    if explained.relation == "exact":
        verdict = "not needed: an exact copy is found by its content hash"
    elif explained.relation == "excerpt" and explained.b_is_match:
        verdict += "; an excerpt is found through its anchors"
    listed = " ".join(map(str, shared)) if shared else "none"
    return (f"{len(shared)} of {explained.bands} shared (candidates share at least {explained.min_shared}: "
            f"{verdict}): {listed}")


def _passages(passages: list[Passage], a: Side, b: Optional[Side], width: int) -> list[str]:
    counts = {kind: sum(p.kind == kind for p in passages) for kind in _MARKS}
    lines = ["", f"passages (normalized words; A = {a.id}, B = {b.id if b else '-'}): {counts['same']} same, "
             f"{counts['changed']} changed, {counts['only_a']} only in A, {counts['only_b']} only in B",
             "  = the same in both   ~ changed: A | B   - only in A   + only in B"]
    column = (width - 5) // 2
    for passage in passages:
        mark = _MARKS[passage.kind]
        if passage.kind == "same":
            for i, line in enumerate(textwrap.wrap(_shortened(passage.a), width - 2) or [""]):
                lines.append(f"{mark if i == 0 else ' '} {line}")
            continue
        left = textwrap.wrap(passage.a, column) or [""]
        right = textwrap.wrap(passage.b, column) or [""]
        for i, (l, r) in enumerate(zip_longest(left, right, fillvalue="")):
            lines.append(f"{mark if i == 0 else ' '} {l:<{column}} | {r}".rstrip())
    return lines


def _shortened(words: str) -> str:
    """A shared passage with its middle left out when it is long (the differences are what is looked for)."""
    parts = words.split()
    if len(parts) <= 3 * SAME_WORDS_SHOWN:
        return words
    left_out = len(parts) - 2 * SAME_WORDS_SHOWN
    return " ".join(parts[:SAME_WORDS_SHOWN] + [f"[... {left_out} words ...]"] + parts[-SAME_WORDS_SHOWN:])
