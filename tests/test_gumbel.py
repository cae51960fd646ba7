"""Coupled sampling's math (sampling/gumbel.py): noise keyed by (seed, position), and argmax(log p + g) ~ p.

The chi-square tests run at alpha 0.01 over thousands of draws, each from its own (seed, position) noise; the
same tests must reject a sampler with the wrong noise or with the temperature applied after the noise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from blockdraft.sampling import SamplingParams, logits_to_probs
from blockdraft.sampling.gumbel import coupled_sample, gumbel_noise, perturbed_scores, position_seed

ALPHA = 0.01
DRAWS = 6000
LOGITS = torch.tensor([2.0, 1.2, 0.9, 0.0, -0.5, -3.0, float("-inf"), 1.5])  # [V]: one token masked


def draws(logits: torch.Tensor, params: SamplingParams, noise_fn=gumbel_noise, sampler=coupled_sample) -> np.ndarray:
    """Counts [V] of DRAWS samples, draw i with the noise of seed i at position 5."""
    V = logits.shape[-1]
    noise = torch.cat([noise_fn(seed, [5], V) for seed in range(DRAWS)])  # [DRAWS, V]
    tokens = sampler(logits.expand(DRAWS, V), noise, params)
    return np.bincount(tokens.numpy(), minlength=V)


def pvalue(counts: np.ndarray, probs: torch.Tensor) -> float:
    probs = probs.double().numpy()
    assert counts[probs == 0].sum() == 0, "a token the filters removed was sampled"
    keep = probs > 0
    expected = probs[keep] / probs[keep].sum() * counts.sum()  # float32 probs sum to 1 only within rounding
    return float(chisquare(counts[keep], expected).pvalue)


def test_noise_depends_only_on_seed_and_position():
    """The same (seed, position) gives the same noise whichever call asks for it: what lets a step's verify and
    the target alone pick the same token."""
    together = gumbel_noise(7, [3, 4, 5], 50)
    apart = torch.cat([gumbel_noise(7, [p], 50) for p in (5, 4, 3)]).flip(0)
    assert torch.equal(together, apart), "a position's noise changed with the positions asked alongside it"
    assert not torch.equal(together[0], together[1]), "two positions share their noise: samples would correlate"
    assert not torch.equal(gumbel_noise(8, [3], 50)[0], together[0]), "two seeds share their noise"
    assert position_seed(7, 3) != position_seed(3, 7), "the key must not be symmetric in seed and position"


def test_noise_is_standard_gumbel():
    noise = gumbel_noise(1, list(range(40)), 1000).double()  # 40,000 entries
    assert abs(noise.mean().item() - 0.5772) < 0.02 and abs(noise.var().item() - np.pi**2 / 6) < 0.05


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.6, top_k=4),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.8, min_p=0.1),
], ids=["T1", "T0.6-topk4", "T1.3-topp0.8", "T0.8-minp0.1"])
def test_perturbed_argmax_follows_p(params):
    counts = draws(LOGITS, params)
    p = pvalue(counts, logits_to_probs(LOGITS, params))
    assert p > ALPHA, f"argmax(log p + g) is not distributed as p (chi-square p = {p:.2e})"


def uniform_noise(seed: int, positions: list[int], vocab_size: int) -> torch.Tensor:
    """Wrong: uniform noise instead of Gumbel."""
    return torch.rand(len(positions), vocab_size, generator=torch.Generator().manual_seed(seed))


def temperature_after_noise(logits, noise, params):
    """Wrong: argmax((logits + g) / T), which samples at temperature 1 whatever T is."""
    return ((logits + noise) / params.temperature).argmax(dim=-1)


@pytest.mark.parametrize("noise_fn, sampler", [(uniform_noise, coupled_sample), (gumbel_noise, temperature_after_noise)],
                         ids=["uniform-noise", "temperature-after-noise"])
def test_a_wrong_sampler_fails_the_same_test(noise_fn, sampler):
    params = SamplingParams(temperature=0.6)
    counts = draws(LOGITS, params, noise_fn, sampler)
    p = pvalue(counts, logits_to_probs(LOGITS, params))
    assert p < ALPHA, f"a wrong sampler passed the test (p = {p:.3f}); the test has no power"


def test_filtered_tokens_score_minus_infinity():
    params = SamplingParams(temperature=1.0, top_k=2)
    scores = perturbed_scores(LOGITS, gumbel_noise(0, [0], 8)[0], params)
    assert torch.isfinite(scores).sum() == 2 and scores.argmax() in (0, 7)
