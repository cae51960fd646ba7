"""Sampling math: the one logits -> probs transform and the pure speculative acceptance functions.

p is the target's distribution, q the draft's; `accept` defines the terms (anchor, block, proposal, accepted,
replacement, bonus, tau).
"""

from .accept import (
    greedy_accept_length,
    greedy_step,
    rejection_accept,
    residual,
    sample_bonus,
    speculative_sample,
    speculative_sample_from_uniforms,
)
from .transforms import Generators, SamplingParams, draw_uniforms, logits_to_probs, sample, sample_from_uniforms

__all__ = [
    "Generators",
    "SamplingParams",
    "draw_uniforms",
    "greedy_accept_length",
    "greedy_step",
    "logits_to_probs",
    "rejection_accept",
    "residual",
    "sample",
    "sample_bonus",
    "sample_from_uniforms",
    "speculative_sample",
    "speculative_sample_from_uniforms",
]
