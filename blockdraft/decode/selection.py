"""Turning logits into tokens inside the decode loop: greedy argmax or exact rejection sampling.

The selector is the only place where the decode loop meets the sampling math; the math itself
lives in `blockdraft.sampling` as pure functions. Each caller row owns one torch.Generator, so a row
draws the same numbers whatever batch it shares and whichever rows finish before it.

Shapes: B live rows, K block size, V vocabulary.
"""

from __future__ import annotations

import torch


def greedy_accept_length(proposals: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """Longest prefix where proposals [B, K-1] equal the target's argmax at slots 0..K-2 ([B, K]) -> [B]."""
    agree = (proposals == target_tokens[:, :-1]).long()  # [B, K-1]
    return agree.cumprod(dim=1).sum(dim=1)


class Selector:
    """Greedy selection (temperature 0)."""

    def first_token(self, logits: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
        """Token for logits [B, V] -> [B]."""
        return logits.argmax(dim=-1)

    def propose(self, draft_logits, anchors, row_ids):
        """Proposals [B, K-1] from draft logits [B, K-1, V] (None: an empty block), and the draft's q."""
        if draft_logits is None:
            return anchors.new_zeros(anchors.shape[0], 0), None
        return draft_logits.argmax(dim=-1), None

    def accept(self, target_logits, draft_probs, proposals, row_ids):
        """Number of accepted proposals [B] and the target's token at the first disagreement [B]."""
        target_tokens = target_logits.argmax(dim=-1)  # [B, K]
        num_accepted = greedy_accept_length(proposals, target_tokens)
        return num_accepted, target_tokens.gather(1, num_accepted[:, None])[:, 0]
