"""Tapped target features kept in memory for the whole run (docs/training.md §7, "offline feature caching").

The target is frozen, so every epoch recomputes the very same features F = hidden_states[l+1] of every
sequence. With the cache the target runs once per sequence per run (per process: a resumed run refills
it lazily); later epochs cost only the draft. Values are those of the first forward that saw the
sequence, stored in the target's dtype, unpadded, in host memory (a GPU target's memory stays the run's: the
cache grows with the data, about 41 KB a token for an 8B target's three layers).

Memory: L·D values per token (SmolLM2, L=2, bf16: 2.3 KB a token, 1 GB for ~450k tokens);
`FeatureCache.nbytes` reports it.

With a `FeatureStore` (feature_store.py: the features written to disk once by `blockdraft features`), a sequence
the store holds is read from it at every step instead, and never kept here: the target runs only for the sequences
it lacks, and the run holds in memory only those (the store's files stay in the page cache, which the system may
reclaim; a copy here would double them in unreclaimable memory, 11 GB for 14k SmolLM2 answers).

Shapes: B sequences, S padded length, L tapped layers, D hidden.
"""

from __future__ import annotations

import torch

from ..model.target import Target
from .feature_store import FeatureStore
from .forward import target_features


class FeatureCache:
    """Dataset index -> features [S_i, L*D] of that sequence (truncated to the run's max length)."""

    def __init__(self, target: Target, tap_layer_ids, disk: FeatureStore | None = None,
                 digests: list[str] | None = None) -> None:
        """`disk` and `digests` (dataset index -> `token_digest` of its whole sequence) read stored features."""
        self.target = target
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.store: dict[int, torch.Tensor] = {}
        self.disk, self.digests = disk, digests
        self.forwards = 0  # target forwards run (one per batch of sequences neither kept nor stored)
        self.read = 0  # sequences read from `disk`

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.store.values())

    def features(self, tokens: torch.Tensor, indices: list[int], lengths: list[int]) -> torch.Tensor:
        """Features [B, S, L*D] for tokens [B, S] (right-padded; row b is dataset index indices[b], of
        lengths[b] real tokens). Unseen rows go through one target forward; padding rows get zeros, which
        no block can see (padding follows every anchor)."""
        rows = {b: self.store[i] for b, i in enumerate(indices) if i in self.store}  # row -> features [S_b, L*D]
        if self.disk is not None:
            for b in [b for b, i in enumerate(indices) if b not in rows and self.digests[i] in self.disk]:
                rows[b] = self.disk.get(self.digests[indices[b]])[: lengths[b]]  # read, not kept
                self.read += 1
        missing = [b for b in range(len(indices)) if b not in rows]
        if missing:
            width = max(lengths[b] for b in missing)
            fresh = target_features(self.target, tokens[missing, :width], self.tap_layer_ids)  # [M, W, L*D]
            self.forwards += 1
            for row, b in enumerate(missing):
                rows[b] = self.store[indices[b]] = fresh[row, : lengths[b]].to("cpu", copy=True)
        B, S = tokens.shape
        out = rows[0].new_zeros(B, S, rows[0].shape[-1])  # assembled on the host, moved once
        for b in range(B):
            out[b, : lengths[b]] = rows[b]
        return out.to(self.target.device)
