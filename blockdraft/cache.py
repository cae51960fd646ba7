"""Key/value caches with one slot per absolute position.

Both the target cache and the draft context cache use the same layout: per layer a pair of tensors
[B, Hkv, capacity, Dh] in which slot t holds position t of that row. Rows are ragged (each has its own
committed length), and a row's entries at or past its length are stale: attention masks hide them and the
next write overwrites them. Rolling back is therefore just setting a length; no tensor is copied.

The decode loop owns the lengths; forwards only write the slots they are given.

`ContextWindow` bounds the draft's context cache (docs/design.md §5): the draft's context cache keeps the first
`sinks` positions and the last `window` positions, so its memory and its attention cost stay flat however long the
context grows.

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

from .errors import InputError


class KVCache:
    """Per-layer K/V slots for B rows, plus one length per row (the number of valid leading slots)."""

    def __init__(self, num_layers, batch, kv_heads, capacity, head_dim, dtype, device) -> None:
        shape = (batch, kv_heads, capacity, head_dim)
        # keys/values are views of the first B rows of these; rows past B are room that `add_rows` fills first.
        self._held_keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._held_values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.keys, self.values = list(self._held_keys), list(self._held_values)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # [B]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
              start: int | None = None) -> None:
        """Store k/v [B, Hkv, T, Dh] at slots positions [B, T] of `layer`; lengths are not touched.

        `start`, when the caller knows that every row's slots are start..start+T-1 (`contiguous_start`), turns
        the scatter into a slice copy: the same values, a fraction of the per-call cost of a decode step."""
        if start is not None:
            T = k.shape[2]
            self.keys[layer].narrow(2, start, T).copy_(k)
            self.values[layer].narrow(2, start, T).copy_(v)
            return
        rows = torch.arange(k.shape[0], device=k.device)[:, None]  # [B, 1]
        # Advanced indexing puts the indexed dims first: the target view is [B, T, Hkv, Dh].
        self.keys[layer][rows, :, positions] = k.transpose(1, 2)
        self.values[layer][rows, :, positions] = v.transpose(1, 2)

    @staticmethod
    def contiguous_start(positions: torch.Tensor) -> int | None:
        """s when the slots positions [B, T] are s..s+T-1 in every row (one CPU check per forward), else None.
        Asked only on CPU: reading s on a GPU would wait for the device at every step."""
        if positions.device.type != "cpu":
            return None
        start = int(positions[0, 0])
        expected = start + torch.arange(positions.shape[1], device=positions.device)
        return start if bool((positions == expected).all()) else None

    def read(self, layer: int, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots [0, upto) of `layer`: two [B, Hkv, upto, Dh] views."""
        return self.keys[layer].narrow(2, 0, upto), self.values[layer].narrow(2, 0, upto)

    def move(self, source: torch.Tensor, dest: torch.Tensor) -> None:
        """Copy each row's slots source [B, n] to its slots dest [B, n] in every layer (a token tree's accepted
        path to the slots of its positions). All sources are read before any destination is written.

        On CPU, leading columns already in place in every row (source == dest: the anchor, and the draft's first
        choices, which best-first order puts first) are not copied, nor anything when all are: most tree steps
        accept their path's first nodes only, and the copy costs about 2 % of a step over 30 layers."""
        if source.device.type == "cpu":
            moved = (source != dest).any(dim=0).nonzero()  # [m, 1] columns out of place in some row
            if not moved.numel():
                return
            first = int(moved[0, 0])
            source, dest = source[:, first:], dest[:, first:]
        rows = torch.arange(source.shape[0], device=source.device)[:, None]  # [B, 1]
        for layer in range(len(self.keys)):
            self.keys[layer][rows, :, dest] = self.keys[layer][rows, :, source]
            self.values[layer][rows, :, dest] = self.values[layer][rows, :, source]

    def crop_to(self, lengths: torch.Tensor) -> None:
        """Roll back (or advance) each row to `lengths` [B] valid slots."""
        self.lengths = lengths.clone()

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop every row not in `rows` [B'] (finished rows stop costing compute).

        Rows kept in ascending order (a decode's live rows) move down in place over the dropped ones, and only
        their slots below the longest kept length (the rest is stale: masked, then overwritten); rows before the
        first dropped one do not move. A whole-capacity copy of every layer would cost about 5 % of a 16-row
        decode whose rows come and go. The dropped rows' memory stays, as room for `add_rows`."""
        kept = rows.tolist()
        if any(b <= a for a, b in zip(kept, kept[1:])):  # another order: gathered into new tensors
            self._held_keys = self.keys = [k[rows] for k in self.keys]
            self._held_values = self.values = [v[rows] for v in self.values]
            self.lengths = self.lengths[rows]
            return
        lengths = self.lengths[rows]
        first = next((j for j, row in enumerate(kept) if row != j), len(kept))  # the first row that moves
        if first < len(kept):
            used = int(lengths.max())
            source, dest = rows[first:], torch.arange(first, len(kept), device=rows.device)
            for tensor in (*self.keys, *self.values):
                tensor[dest, :, :used] = tensor[source, :, :used]
        self.keys = [k[: len(kept)] for k in self._held_keys]
        self.values = [v[: len(kept)] for v in self._held_values]
        self.lengths = lengths

    def put_rows(self, rows: torch.Tensor, other: "KVCache", upto: int) -> None:
        """Copy slots [0, upto) of every row of `other` into this cache's rows `rows` [b] (a prefill run on
        its own cache); lengths are not touched."""
        for mine, theirs in zip((*self.keys, *self.values), (*other.keys, *other.values)):
            mine[rows, :, :upto] = theirs[:, :, :upto]

    def add_rows(self, other: "KVCache") -> None:
        """Append the rows of `other` (same layers, heads, capacity and dtype) after this cache's rows: into the
        room dropped rows left (their slots below `other`'s longest length), else into new tensors."""
        if other.capacity != self.capacity or len(other.keys) != len(self.keys):
            raise ValueError(f"cannot join a cache of {len(other.keys)} layers x {other.capacity} slots to one of "
                             f"{len(self.keys)} x {self.capacity}")
        B, n = self.keys[0].shape[0], other.keys[0].shape[0]
        if self._held_keys[0].shape[0] >= B + n:
            used = int(other.lengths.max()) if n else 0
            for held, new in zip((*self._held_keys, *self._held_values), (*other.keys, *other.values)):
                held[B: B + n, :, :used] = new[:, :, :used]
            self.keys = [k[: B + n] for k in self._held_keys]
            self.values = [v[: B + n] for v in self._held_values]
        else:
            self._held_keys = self.keys = [torch.cat([a, b]) for a, b in zip(self.keys, other.keys)]
            self._held_values = self.values = [torch.cat([a, b]) for a, b in zip(self.values, other.values)]
        self.lengths = torch.cat([self.lengths, other.lengths])


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
