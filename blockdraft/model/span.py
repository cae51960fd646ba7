"""Attention spans: which cache slots a forward's new tokens see, over a span rounded up to SPAN_GRID slots.

Shapes: B rows, T new tokens a row.
"""

from __future__ import annotations

import torch


def attention_mask(positions: torch.Tensor, slots: torch.Tensor | None, block_mask: torch.Tensor | None,
                    capacity: int):
    """[B, T, span] bool over cache slots: causal by position, or context-plus-`block_mask` for a tree. The span is
    rounded up to a multiple of SPAN_GRID (within `capacity`)."""
    if slots is None:
        columns = torch.arange(_span(int(positions.max()) + 1, capacity), device=positions.device)
        return columns[None, None, :] <= positions[:, :, None]
    B, T = slots.shape
    columns = torch.arange(_span(int(slots.max()) + 1, capacity), device=slots.device)
    mask = (columns[None, :] < slots[:, :1]).unsqueeze(1).repeat(1, T, 1)  # the context before the first slot
    return mask.scatter(2, slots[:, None, :].expand(B, T, T), block_mask)


# Attention spans are rounded up to a multiple of this. The CPU attention kernel sums a query's keys in vector
# lanes of 16 floats, so two spans of other lengths can sum one row's keys in other orders, and in bf16 round it
# apart: a one-token step of the target alone (span p + 1) against the same token in a K-row verify block (span
# p + K). Masked keys in whole extra lanes add exact zeros, so on a common grid the row is the same bits
# (tests/test_decode.py; docs/design.md §14).
SPAN_GRID = 16


def _span(needed: int, capacity: int) -> int:
    return min(on_span_grid(needed), capacity)


def on_span_grid(positions: int) -> int:
    """`positions` rounded up to a multiple of SPAN_GRID."""
    return -(-positions // SPAN_GRID) * SPAN_GRID
