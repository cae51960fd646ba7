"""The real rows of a ragged forward (`Target.forward(..., widths=)`): a verify step whose rows propose unequal
numbers of tokens runs every product over each row's own tokens only, and attention over the rectangle.

Shapes: B rows, T tokens a row, M = B * T, M' the real ones, F features.
"""

from __future__ import annotations

import torch


class Ragged:
    """The real rows of a ragged forward: row b's first widths[b] of T tokens, as flat indices into the B * T
    rows of the rectangle, in order. `gather` keeps them ([M, F] -> [M', F]); `spread` puts them back in place,
    zeros elsewhere ([M', F] -> [M, F])."""

    def __init__(self, index: torch.Tensor, total: int) -> None:
        self.index, self.total = index, total  # [M'], M

    @classmethod
    def of(cls, widths: torch.Tensor | None, T: int) -> Ragged | None:
        """The real rows of widths [B] over T tokens a row; None when every row is whole (or no widths)."""
        if widths is None or bool((widths >= T).all()):
            return None
        real = torch.arange(T, device=widths.device)[None, :] < widths[:, None]  # [B, T]
        return cls(real.flatten().nonzero().squeeze(1), real.numel())

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x.index_select(0, self.index)

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(self.total, x.shape[-1]).index_copy_(0, self.index, x)
