"""Bounded draft memory (docs/design.md §5): the draft's context cache keeps the first `sinks` positions and the last
`window` positions, so its memory and its attention cost stay flat however long the context grows.

Slots: position p < sinks lives in slot p; any later position in slot sinks + (p - sinks) mod window, a ring.
The positions a row keeps are then exactly its first min(n, sinks + window) slots (n: positions seen), so the
draft's ordinary length mask serves unchanged. One more slot, past them, takes what is written but never kept
(padding of a ragged batch, and positions that an append itself pushes out of the window): never read.

Each context position's keys and values depend on that position alone (its features, projected and rotated at
its absolute position), so dropping one only hides it from the block's attention; nothing else changes. Output
stays exact (the target verifies every token); acceptance is what a narrower view costs, measured in docs/history.md
(bounded draft memory).

Shapes: B rows, P appended positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError


@dataclass(frozen=True)
class ContextWindow:
    window: int  # the most recent positions kept
    sinks: int = 4  # the first positions, always kept (attention sinks: the draft learnt to lean on them)

    def __post_init__(self) -> None:
        if not (isinstance(self.window, int) and self.window >= 1):
            raise InputError(f"the draft context window must be a whole number of positions >= 1, got "
                             f"{self.window!r}; pass e.g. --draft-window 1024, or leave it out for the whole context")
        if not (isinstance(self.sinks, int) and self.sinks >= 0):
            raise InputError(f"the draft's sink positions must be a whole number >= 0, got {self.sinks!r}")

    @property
    def capacity(self) -> int:
        """Slots a row needs: the kept positions and the one slot that takes what is not kept."""
        return self.sinks + self.window + 1

    def slots(self, positions: torch.Tensor, valid: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        """The slot [B, P] of each appended position [B, P]; valid [B, P] marks real entries (not padding) and
        total [B] is each row's positions seen once this append is done."""
        ring = torch.where(positions < self.sinks, positions,
                           self.sinks + (positions - self.sinks).remainder(self.window))
        kept = valid & ((positions < self.sinks) | (positions >= total[:, None] - self.window))
        return torch.where(kept, ring, torch.full_like(ring, self.capacity - 1))

    def lengths(self, total: torch.Tensor) -> torch.Tensor:
        """Kept slots per row [B] after `total` [B] positions: the cache's valid leading slots."""
        return total.clamp(max=self.sinks + self.window)
