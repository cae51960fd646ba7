"""The one logits -> probabilities transform, and sampling by inverse CDF from explicit uniforms.

`logits_to_probs` runs once on the target's logits (giving p) and once on the draft's logits (giving q) with the
same `SamplingParams`, so the acceptance math in `accept.py` only ever sees probabilities (docs/design.md §3).

Randomness enters as uniforms in [0, 1). They come from one torch.Generator for a whole batch, from the global
generator (None), or from one generator per row, so that a row draws the same numbers whatever batch it shares.

Shapes: B rows, V vocabulary; `...` is any number of leading dimensions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import InputError

# One generator for the batch, one per row (rows reproducible alone or batched), or None for the global one.
Generators = torch.Generator | Sequence[torch.Generator] | None


def _number(name: str, value, valid: str, fix: str) -> float:
    # A string or None would otherwise surface later as a TypeError deep inside a comparison.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"`{name}` must be a number in {valid}, got {value!r} ({type(value).__name__}); {fix}")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution. temperature 0 is greedy (argmax) decoding.

    The filters apply in this order: temperature, top-k, top-p, min-p; then the survivors are renormalised.
    top_k 0, top_p 1 and min_p 0 switch their filter off. `seed` seeds the caller's generators (None: random).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        t = _number("temperature", self.temperature, "[0, inf)", "use 0 for greedy or a positive value such as 0.7")
        # NaN fails every comparison, so each range test is written to be False for NaN.
        if not (0.0 <= t < math.inf):
            raise InputError(f"`temperature` must be a finite number >= 0, got {self.temperature}; "
                             "use 0 for greedy decoding or a positive value such as 0.7")
        # A negative or fractional top_k would reach torch.topk as an invalid size, far from the request.
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InputError(f"`top_k` must be an integer >= 0, got {self.top_k!r}; use 0 to disable top-k")
        top_p = _number("top_p", self.top_p, "(0, 1]", "use 1 to disable top-p")
        if not (0.0 < top_p <= 1.0):
            raise InputError(f"`top_p` must be in (0, 1], got {self.top_p}; use 1 to disable top-p")
        min_p = _number("min_p", self.min_p, "[0, 1)", "use 0 to disable min-p")
        # min_p = 1 would keep only exact ties with the top token: almost surely greedy, so say so instead.
        if not (0.0 <= min_p < 1.0):
            raise InputError(f"`min_p` must be in [0, 1), got {self.min_p}; use 0 to disable min-p")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**64):
            raise InputError(f"`seed` must be None or an integer in [0, 2**64), got {self.seed!r}; "
                             "pass a non-negative integer or omit it")

    @property
    def greedy(self) -> bool:
        """True at temperature 0: every distribution is the one-hot of its argmax."""
        return self.temperature == 0


def _check_logits(logits: torch.Tensor, row_max: torch.Tensor) -> None:
    """Raise on NaN, +inf or all -inf rows; `row_max` [..., 1] already shows all three (NaN and +inf propagate)."""
    if bool(torch.isfinite(row_max).all()):  # one reduction and one sync on the common path
        return
    nan, pos_inf = int(torch.isnan(logits).sum()), int(torch.isposinf(logits).sum())
    if nan or pos_inf:
        raise InputError(f"logits contain NaN/inf ({nan} NaN, {pos_inf} +inf entries in shape "
                         f"{list(logits.shape)}); -inf is allowed as a mask; check the model for overflow "
                         "(run it in float32 or bfloat16, not float16)")
    rows = int(torch.isneginf(row_max).sum())
    raise InputError(f"{rows} logits row(s) are all -inf, so no token can be sampled (shape {list(logits.shape)}); "
                     "leave at least one token unmasked in every row")


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest set of most likely tokens whose mass reaches top_p (top token always kept)."""
    # [..., V]
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    # Mass strictly before each token in sorted order. Keeping tokens while it is < top_p keeps exactly the
    # smallest prefix reaching top_p, and always the top token (mass 0 before it). E.g. [.5, .3, .2], top_p .6:
    # before = [0, .5, .8] -> keep the first two.
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    # `before > 0` keeps the top token even for a top_p that float32 rounds to 0 (1e-300 would drop it).
    drop = torch.empty_like(before, dtype=torch.bool).scatter_(-1, order, (before >= top_p) & (before > 0))
    return probs.masked_fill(drop, 0.0)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The one transform from logits to a sampling distribution, used for both p (target) and q (draft).

    Greedy params give the one-hot of the argmax (first index on ties). Otherwise: divide by the temperature,
    keep the top_k largest (ties with the k-th kept too), keep the top_p nucleus, keep tokens with probability
    >= min_p * the top probability, renormalise. -inf logits are masked tokens; NaN, +inf and all -inf rows raise.
    """
    # [..., V]
    if params.greedy:
        logits, _ = _checked(logits)
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    probs = torch.softmax(scaled_logits(logits, params), dim=-1)  # [..., V]
    if params.top_p < 1.0:
        probs = _nucleus(probs, params.top_p)
    if params.min_p > 0.0:
        # The top token survives every filter, so its probability is the same before and after them.
        probs = probs.masked_fill(probs < params.min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def scaled_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(logits - max) / temperature float32 [..., V], -inf outside the top_k: log p up to a constant per row
    when top_p and min_p are off (`logits_to_probs` applies those to its softmax). Checks the logits."""
    logits, row_max = _checked(logits)
    # Subtracting the max first keeps every value <= 0, so a tiny temperature cannot overflow to +inf (NaN); one
    # below float32's smallest normal would round to 0 and make the max 0/0: it divides as that smallest normal.
    scaled = (logits - row_max) / max(params.temperature, torch.finfo(torch.float32).tiny)  # [..., V]
    if 0 < params.top_k < logits.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    return scaled


def _checked(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V] as float32 and their row max [..., 1], after refusing an empty vocabulary, NaN, +inf and
    all -inf rows (the max shows all three, and the caller reuses it)."""
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise InputError(f"logits must have shape [..., V] with V >= 1, got {list(logits.shape)}; "
                         "pass the model's output scores over the vocabulary")
    logits = logits.float()
    row_max = logits.amax(dim=-1, keepdim=True)  # [..., 1]
    _check_logits(logits, row_max)
    return logits, row_max


def draw_uniforms(generator: Generators, shape: tuple[int, ...], device: torch.device | str | None = None
                  ) -> torch.Tensor:
    """Uniforms in [0, 1) of `shape`, float64, on `device`.

    With a sequence of generators, shape[0] must equal its length and row b is drawn from generator b alone,
    as one call of torch.rand(shape[1:]): a row's numbers do not depend on the other rows of the batch.
    """
    shape = tuple(shape)
    if generator is None or isinstance(generator, torch.Generator):
        source = generator.device if generator is not None else device
        return torch.rand(shape, generator=generator, dtype=torch.float64, device=source).to(device)
    if len(shape) == 0 or len(generator) != shape[0]:
        raise InputError(f"got {len(generator)} generators for uniforms of shape {list(shape)}; "
                         "pass one torch.Generator per row (the first dimension)")
    rows = [torch.rand(shape[1:], generator=g, dtype=torch.float64, device=g.device).to(device) for g in generator]
    return torch.stack(rows) if rows else torch.empty(shape, dtype=torch.float64, device=device)


def sample_from_uniforms(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: the first token whose cumulative weight exceeds u * total weight.

    probs need not be normalised, only non-negative with a positive total in every row. A token with zero
    weight is never returned.
    """
    # [..., V], [...] -> [...] int64
    if probs.dim() == 0 or uniforms.shape != probs.shape[:-1]:
        raise InputError(f"uniforms must have shape {list(probs.shape[:-1])} (probs {list(probs.shape)} "
                         f"without its last dimension), got {list(uniforms.shape)}; draw one uniform per row")
    # float64 keeps the running sum over a 150k-token vocabulary accurate to far below one float32 step.
    cdf = probs.double().cumsum(dim=-1)  # [..., V]
    total = cdf[..., -1:]  # [..., 1]
    if not bool((total > 0).all()):  # also catches NaN
        raise InputError(f"cannot sample from probabilities of shape {list(probs.shape)}: some rows have total "
                         "weight 0 or NaN; pass non-negative weights with at least one positive entry per row")
    tokens = torch.searchsorted(cdf, uniforms.double().unsqueeze(-1) * total, right=True).squeeze(-1)
    # u * total can round up to total itself; never step past the last token that has weight.
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)  # [...]
    return torch.minimum(tokens, last)


def sample(probs: torch.Tensor, generator: Generators = None) -> torch.Tensor:
    """One token per row of probs [..., V] -> [...] int64, with uniforms from `generator` (see draw_uniforms)."""
    if probs.dim() == 0:
        raise InputError(f"probs must have shape [..., V], got {list(probs.shape)}; pass a distribution")
    return sample_from_uniforms(probs, draw_uniforms(generator, probs.shape[:-1], probs.device))
