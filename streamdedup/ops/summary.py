"""What a run did, in counts: the summary the offline command and the worker print at the end."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..core.records import REJECTED, Decision

__all__ = ["Summary"]


@dataclass
class Summary:
    """Counts of one run."""

    outcomes: Counter = field(default_factory=Counter)  # kept, duplicate, rejected
    exact: int = 0
    replayed: int = 0
    reasons: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    resumed: bool = False

    def add(self, decisions: list[Decision]) -> None:
        """Count a batch's decisions (a column at a time: one pass in C each, not five Python steps a decision)."""
        statuses = [d.status for d in decisions]
        self.outcomes.update(statuses)
        self.exact += sum([d.exact for d in decisions])
        self.replayed += sum([d.replayed for d in decisions])
        if REJECTED in statuses:
            self.reasons.update((d.reason or "").split(":")[0] for d in decisions if d.status == REJECTED)

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())

    def lines(self) -> list[str]:
        rate = self.total / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"documents  {self.total:>10,}   ({rate:,.0f} docs/s in {self.seconds:.1f} s)",
            f"kept       {self.outcomes['kept']:>10,}",
            f"duplicate  {self.outcomes['duplicate']:>10,}   ({self.exact:,} exact copies)",
            f"rejected   {self.outcomes['rejected']:>10,}"
            + (f"   ({', '.join(f'{k} {v}' for k, v in sorted(self.reasons.items()))})" if self.reasons else ""),
        ]
        if self.replayed:
            lines.append(f"replayed   {self.replayed:>10,}   (already decided before; earlier decision repeated)")
        if self.resumed:
            lines.append("(resumed an interrupted run; counts cover this part only)")
        return lines
