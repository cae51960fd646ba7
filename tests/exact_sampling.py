"""Exact sampling's statistics, shared by the sampling tests (test_sampling_decode, test_lookup, test_ngrams): a
tiny vocabulary whose joint over a few tokens is enumerable, the target's exact joint from plain HF forwards, a
chi-square test of sampled counts against it, and a deliberately wrong tree sampler that the tests must catch.
The models they run on are conftest's `small_models` fixture.
"""

from __future__ import annotations

import numpy as np
import torch

from blockdraft.model.target import Target
from blockdraft.sampling import SamplingParams, logits_to_probs

ALPHA = 0.01
SMALL_VOCAB = 6  # joint of 3 tokens = 216 cells: enumerable, and thousands of rows fill them
NUM_TOKENS = 3
NUM_ROWS = 8000


@torch.inference_mode()
def exact_joint(target: Target, prompt: list[int], params: SamplingParams, num_tokens: int) -> np.ndarray:
    """P(t1..tn | prompt) for every continuation, flat [V**n] in lexicographic order, from plain HF forwards.

    p(t1..tn) = prod_i p(t_i | prompt, t1..t_(i-1)), each factor the same logits_to_probs transform the decode
    loop applies, over the model's own forward rather than blockdraft's cached one: an independent oracle.
    """
    V = target.config.vocab_size
    joint = torch.ones(1, dtype=torch.float64)  # [V**i]: probability of each length-i prefix
    prefixes = torch.tensor([prompt])  # [V**i, P + i]
    for _ in range(num_tokens):
        probs = logits_to_probs(target.model(prefixes).logits[:, -1], params).double()  # [V**i, V]
        joint = (joint[:, None] * probs).reshape(-1)
        grown = prefixes.repeat_interleave(V, dim=0)
        prefixes = torch.cat([grown, torch.arange(V).repeat(prefixes.shape[0])[:, None]], dim=1)
    return joint.numpy()


def goodness_of_fit(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of counts against exact probabilities; cells expecting < 5 are pooled into one."""
    from scipy.stats import chisquare

    # A sample in a cell the filters give probability 0 is a bug whatever the statistics say.
    impossible = counts[probs == 0].sum()
    assert impossible == 0, f"{impossible} samples have probability 0 under the target's filtered distribution"
    expected = probs / probs.sum() * counts.sum()
    big = expected >= 5
    observed, wanted = list(counts[big]), list(expected[big])
    pooled_observed, pooled_expected = counts[~big].sum(), expected[~big].sum()
    if pooled_expected >= 5:
        observed.append(pooled_observed)
        wanted.append(pooled_expected)
    elif pooled_expected > 0:  # too little to stand alone: join the smallest kept cell
        smallest = int(np.argmin(wanted))
        observed[smallest] += pooled_observed
        wanted[smallest] += pooled_expected
    return float(chisquare(observed, wanted).pvalue)


def final_draw_from_p(p, tokens, parents, generator=None):
    """Wrong: the token after the deepest accepted node drawn from p instead of the residual without the
    rejected guesses, so a rejected guess can come back and the tree's tokens are over-weighted."""
    from blockdraft.sampling.tree import deepest_node
    from blockdraft.sampling import sample
    from blockdraft.sampling.tree import tree_sample

    ok, _ = tree_sample(p, tokens, parents, generator)
    deepest = deepest_node(ok)
    return ok, sample(p[torch.arange(p.shape[0]), deepest], generator)


def joint_counts(results, vocab_size: int) -> np.ndarray:
    """How often each sequence of NUM_TOKENS tokens was drawn over decode results (one per row) [V**NUM_TOKENS]."""
    tokens = np.array([r.tokens for r in results])  # [rows, n]
    cells = (tokens * vocab_size ** np.arange(NUM_TOKENS - 1, -1, -1)).sum(axis=1)
    return np.bincount(cells, minlength=vocab_size**NUM_TOKENS)
