"""The speculation cache (methods.md §5.1 item 6, §5.2): next blocks drafted ahead, one per selected
verification outcome of the block under verification.

An entry is keyed by the outcome it was drafted for, spelled in tokens: the committed length when
the block was drafted (its anchor's position), the accepted drafts d_1..d_k and the bonus a. Tokens,
not node ids: the next block's context is the committed token sequence, so an entry serves exactly
the verified outcome that commits the same tokens at the same position (a duplicate sibling, never
reached by a walk verifier, can never be a key: selection gives it no probability).

The cache holds one block's entries at a time: `fill` replaces them, `take` hands out the entry of
the verified outcome (or None: a miss) and empties the cache, so an entry drafted for an earlier
block can never be served later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from torch import Tensor


@dataclass(frozen=True)
class Outcome:
    """What verification decided about one block: base = committed length before it (the anchor's
    position), accepted = the accepted draft tokens d_1..d_k, bonus = the emitted bonus token."""

    base: int
    accepted: tuple[int, ...]
    bonus: int


@dataclass
class Entry:
    """A block drafted ahead for `outcome`: the tree node where that walk stops and the path to it
    (root first), its row in the foresight batch, the predicted tapped states the block was drafted
    from (`states`: every tree node's [1, N, m*d], shared by the block's entries; `accepted_states`:
    those of the positions the outcome commits, which the true ones replace once verified), and the
    drafted block (the last pass's per-depth log-probs [D, V] below anchor = outcome.bonus)."""

    outcome: Outcome
    node: int
    row: int
    path: tuple[int, ...]
    states: Tensor
    block: Tensor
    meta: dict = field(default_factory=dict)

    @property
    def anchor(self) -> int:
        return self.outcome.bonus

    @property
    def accepted_states(self) -> Tensor:
        """[1, k+1, m*d]: the predicted states of the root and the accepted drafts."""
        return self.states[:, list(self.path)]


class SpeculationCache:
    """One block's entries, looked up by the verified outcome."""

    def __init__(self) -> None:
        self.entries: dict[Outcome, Entry] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def fill(self, entries: Iterable[Entry]) -> None:
        """Replace the cache by `entries` (the first of equal outcomes is kept)."""
        self.entries = {}
        for e in entries:
            self.entries.setdefault(e.outcome, e)

    def take(self, verified: Outcome) -> Entry | None:
        """The entry drafted for exactly `verified`, or None; the cache is empty afterwards."""
        entry = self.entries.get(verified)
        self.entries = {}
        return entry

    def clear(self) -> None:
        self.entries = {}
