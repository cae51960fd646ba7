"""Coupled sampling: every position's token is argmax(log p + g) for Gumbel noise g keyed by (seed, position).

The Gumbel-max trick: for g with i.i.d. standard Gumbel entries, argmax(log p + g) is distributed exactly as p.
Here the noise of a position depends only on the row's seed and the position itself, never on the tokens before
it, so a sequence drawn this way is an exact sample of the target (each position gets fresh, independent noise).

What it buys speculative decoding: the draft proposes argmax(log q + g) (or its top-k) with the *same* noise, and
the target's choice at each position is a deterministic function of its logits and the seed. So verification is
greedy verification of perturbed scores: a seeded sample equals the target-alone sample of the same seed token
for token, at any block size, tree width or batch, and every greedy device (adaptive widths, token trees, prompt
lookup) applies unchanged. The draft guesses well when q is close to p, since both argmaxes see the same noise.

p is the target's distribution, q the draft's (docs/design.md §3), both through `logits_to_probs`.
Shapes: n positions, V vocabulary; `...` any leading dimensions.
"""

from __future__ import annotations

import math

import torch

from .argmax import first_argmax
from .transforms import SamplingParams, logits_to_probs, scaled_logits

_MASK64 = 2**64 - 1


def _splitmix64(x: int) -> int:
    """A bijective 64-bit mixer: nearby (seed, position) pairs get unrelated generator seeds."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_seed(seed: int, position: int) -> int:
    """The generator seed of one (row seed, absolute position) pair."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ (position & _MASK64))


def gumbel_noise(seed: int, positions: list[int], vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise [n, V] float32 for `positions` of the row seeded `seed`; the same position always
    gets the same noise, whichever call asks for it."""
    generator = torch.Generator()
    rows = []
    for position in positions:
        generator.manual_seed(position_seed(seed, position))
        # torch.rand draws from [0, 1): u = 0 gives -log(-log 0) = -inf, a token never picked. Not a bias: the
        # chance is 2**-24 per entry, far below what any test or sample size resolves.
        rows.append(torch.rand(vocab_size, generator=generator))
    uniforms = torch.stack(rows) if rows else torch.empty(0, vocab_size)
    return uniforms.log_().neg_().log_().neg_()  # -log(-log u), in place


def perturbed_scores(logits: torch.Tensor, noise: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """log p + g, up to a constant per row, for logits [..., V] and noise [..., V] -> [..., V] float32: its argmax
    is an exact sample of p, tokens that the filters drop scoring -inf. The same transform serves the draft:
    log q + g. A constant per row changes neither the argmax nor a softmax over the row, so p is not normalised
    (what `logits_to_probs` would add is a softmax and a log over the vocabulary, at every node of every step)."""
    scores = scaled_logits(logits, params)  # [..., V]
    if params.top_p < 1.0 or params.min_p > 0.0:  # these filters are defined on p itself
        scores = scores.masked_fill(logits_to_probs(logits, params) == 0, -math.inf)
    return scores + noise.to(logits.device)


def coupled_sample(logits: torch.Tensor, noise: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """argmax(log p + g) [...] int64: one exact sample per row of logits [..., V]."""
    return first_argmax(perturbed_scores(logits, noise, params))
