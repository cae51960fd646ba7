"""Per-row decode state: committed tokens, lengths, budgets, stop tokens and what each row returned.

Rows are ragged: row b has committed lengths[b] tokens, the last of which (the anchor) is not yet in the
target cache. Finished rows are dropped from every tensor (`keep_rows`) so that they stop costing compute;
`row_ids` maps the live rows back to the caller's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Integral

import torch

from ..metrics import AcceptanceStats
from .pending import Pending


@dataclass
class RowResult:
    """What one prompt produced."""

    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (a stop token was emitted, and is included), "length" or "dropped"


class DecodeState:
    def __init__(self, prompts: list[list[int]], capacity: int, max_new_tokens: int | list[int], stop_ids,
                 device, first_row: int = 0) -> None:
        """`first_row`: the caller's index of the first prompt (rows joining a running decode, `add_rows`)."""
        B = len(prompts)
        self.tokens = torch.zeros(B, capacity, dtype=torch.long, device=device)  # [B, capacity]
        for b, ids in enumerate(prompts):
            self.tokens[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        self.prompt_lengths = torch.tensor([len(p) for p in prompts], device=device)  # [B]
        self.lengths = self.prompt_lengths.clone()  # [B] committed tokens, anchor included
        self.row_ids = torch.arange(first_row, first_row + B, device=device)  # [B] caller's index of each live row
        # Budget of each row (caller's order): one for all, or one per prompt.
        one = isinstance(max_new_tokens, Integral)
        budgets = [int(max_new_tokens)] * B if one else [int(b) for b in max_new_tokens]
        self.budgets = [0] * first_row + budgets
        self.stop_ids = frozenset(stop_ids)
        self.results = [RowResult() for _ in range(first_row + B)]
        self.pending: Pending | None = None  # tapped features not yet in the draft cache (set by the prefill)
        self.target_cache = None  # the target's KVCache for these rows, set by the decode loop

    @property
    def batch(self) -> int:
        return self.row_ids.shape[0]

    def anchors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The newest committed token of each row [B] and its position [B]."""
        positions = self.lengths - 1
        return self.tokens.gather(1, positions[:, None])[:, 0], positions

    def commit(self, candidates: torch.Tensor, counts: torch.Tensor, stats: list[AcceptanceStats] | None,
               width: int | None = None, lookup: bool = False):
        """Append the first counts[b] of candidates [B, C] to each row; returns [(row_id, new_tokens)].

        `width` is the verify width of the step (None: the prefill, not counted in tau); `lookup`, whether its
        proposals came from a prompt lookup.

        Tokens past a stop token or past the row's budget are computed but not returned, and end the row.
        Lengths advance by the full count: the row is finished then, so its state is never read again. The step's
        tau counts only the returned tokens (metrics.py), as the reference runtime and transformers count it.
        """
        C = candidates.shape[1]
        slots = (self.lengths[:, None] + torch.arange(C, device=counts.device)).clamp(max=self.tokens.shape[1] - 1)
        keep = torch.arange(C, device=counts.device)[None, :] < counts[:, None]  # [B, C]
        self.tokens.scatter_(1, slots, torch.where(keep, candidates, self.tokens.gather(1, slots)))
        self.lengths = self.lengths + counts
        events = []
        for b, (row, n, new) in enumerate(zip(self.row_ids.tolist(), counts.tolist(), candidates.tolist())):
            result = self.results[row]
            new = new[: min(n, self.budgets[row] - len(result.tokens))]
            for i, token in enumerate(new):
                if token in self.stop_ids:
                    new = new[: i + 1]
                    result.finish_reason = "stop"
                    break
            if stats is not None:  # after the cut: a step that ran past the budget counts what it returned
                stats[row].record(len(new), width, lookup, committed=n)
            result.tokens.extend(new)
            if result.finish_reason is None and len(result.tokens) >= self.budgets[row]:
                result.finish_reason = "length"
            events.append((row, new))
        return events

    def drop(self, rows) -> None:
        """End the rows `rows` (caller's indices) now, whatever they have produced: they stop costing compute."""
        for row in rows:
            if self.results[row].finish_reason is None:
                self.results[row].finish_reason = "dropped"

    def live_rows(self) -> torch.Tensor:
        """Indices [B'] of the rows that are not finished."""
        alive = [b for b, row in enumerate(self.row_ids.tolist()) if self.results[row].finish_reason is None]
        return torch.tensor(alive, dtype=torch.long, device=self.lengths.device)

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.tokens = self.tokens[rows]
        self.prompt_lengths = self.prompt_lengths[rows]
        self.lengths = self.lengths[rows]
        self.row_ids = self.row_ids[rows]
        self.pending.keep_rows(rows)  # as wide as the longest kept row's entries

    def add_rows(self, other: "DecodeState") -> None:
        """Append the live rows of `other`, a state built with first_row = len(self.results) and prefilled on its
        own cache, after this state's rows: tokens, lengths, results, pending features and the target cache."""
        first = len(self.results)
        if other.row_ids.numel() and int(other.row_ids[0]) != first:
            raise ValueError(f"joining rows must start at caller index {first}, got {int(other.row_ids[0])}")
        self.tokens = torch.cat([self.tokens, other.tokens])
        self.prompt_lengths = torch.cat([self.prompt_lengths, other.prompt_lengths])
        self.lengths = torch.cat([self.lengths, other.lengths])
        self.row_ids = torch.cat([self.row_ids, other.row_ids])
        self.budgets += other.budgets[first:]
        self.results += other.results[first:]
        self.pending.stack(other.pending)
        self.target_cache.add_rows(other.target_cache)

