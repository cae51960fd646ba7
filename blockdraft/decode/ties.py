"""Where two decodes of the same prompts part ways, and how strongly the target preferred either token there.

Speculative decoding picks every token from the target's own scores, but computes them differently from the
target alone: a verify of K rows or N tree nodes instead of one-row steps, which sums its products in another
order (a different GEMM kernel; cuBLAS chooses by row count; 16-bit floats round at every layer). Where the
target's two best tokens lie closer than that rounding, the two runs can pick differently, each the target's
choice to within rounding. `first_split` finds the first such position and recomputes the target's margin there
in one forward; `is_rounding` tells a near-tie from a margin that rounding cannot explain, which marks a bug.

Shapes: V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# A float32 margin within ROUNDING_EPS of the scores' scale is a near-tie: a sum of D products in another order
# moves a logit by about sqrt(D) ulps of its terms; 64 ulps of the largest score covers D up to a few thousand.
ROUNDING_ULPS = 64


@dataclass(frozen=True)
class Split:
    row: int  # the prompt
    index: int  # the first new token where the runs differ
    base_token: int  # the target alone's token there
    other_token: int  # the other run's token there
    margin: float  # the target's score of base_token minus that of other_token, recomputed
    scale: float  # the largest |score| at that position: what rounding is relative to


def first_split(target, prompts: list[list[int]], base: list[list[int]], other: list[list[int]],
                pick_scores=None) -> Split | None:
    """The first differing token of the first row whose runs differ (None when none does), with the target's
    margin there from one forward over the prompt and the common prefix.

    `pick_scores(row, position, logits [V]) -> [V]` gives the scores whose argmax the target picks (coupled
    sampling: log p + g); None: the logits themselves (greedy). A row whose runs agree until one stops scores
    nothing: its stop token is the one that differs.
    """
    for row, (prompt, a, b) in enumerate(zip(prompts, base, other)):
        index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if index is None:
            continue  # equal where both ran: max_new_tokens and the stop tokens are the same for both
        ids = torch.tensor([prompt + a[:index]], device=target.device)  # [1, P + index]
        length = ids.shape[1]
        positions = torch.arange(length, device=target.device)[None]
        with torch.inference_mode():
            logits = target.forward(ids, positions, target.new_cache(1, length),
                                    logit_rows=positions[:, -1:]).logits[0, 0]  # [V] float32
            scores = logits if pick_scores is None else pick_scores(row, length, logits)
        finite = scores[torch.isfinite(scores)]
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        return Split(row, index, a[index], b[index], float(scores[a[index]] - scores[b[index]]), scale)
    return None


def is_rounding(split: Split, dtype: torch.dtype) -> bool:
    """Whether the split's margin lies within what rounding in `dtype` can move it (a near-tie)."""
    return abs(split.margin) <= ROUNDING_ULPS * torch.finfo(dtype).eps * max(split.scale, 1.0)
