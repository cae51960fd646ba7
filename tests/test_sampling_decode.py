"""Exact sampling through the whole decode loop (docs/design.md §3).

At temperature > 0 the speculative loop's first tokens follow the target's own joint distribution, computed
exactly by enumerating every continuation on a tiny vocabulary; a chi-square test at alpha 0.01 over thousands of
seeded rows. The same test must reject deliberately broken acceptance rules. Batching, seeds and bad sampling
input: test_batches.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blockdraft.io.drafts import LoadedDraft
from blockdraft.decode.drafter import Drafter
from blockdraft.decode.generate import generate
from blockdraft.decode.policy import make_policy
from blockdraft.decode.selection import Selector
from blockdraft.sampling import (
    SamplingParams,
    draw_uniforms,
    rejection_accept,
    sample_from_uniforms,
)

from step_fakes import CyclingWidth, own_proposer, proposer
from exact_sampling import (ALPHA, NUM_ROWS, NUM_TOKENS, exact_joint, final_draw_from_p, goodness_of_fit,
                            joint_counts)

SMALL_PROMPT = [3, 0, 4, 2]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads; on a busy shared CPU the thread handoffs cost 10x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------- tiny vocabulary
# (the small_models fixture: conftest.py; the exact joint and the chi-square test: exact_sampling.py)


def sampled_counts(target, draft, params, *, block_size=4, num_rows=NUM_ROWS, draft_argmax=False,
                   cycle_widths=False, tree=False, coupled=False) -> np.ndarray:
    """Counts [V**n] of the first NUM_TOKENS tokens over num_rows rows of one prompt, one seed per row."""
    V = target.config.vocab_size
    selector = Selector(params, num_rows=num_rows, draft_argmax=draft_argmax, coupled=coupled)
    policy = CyclingWidth(block_size) if cycle_widths else make_policy(block_size, False, tree=tree)
    guesses = own_proposer(target, draft, policy, tree=tree, block_size=block_size)
    results = generate(target, guesses, [SMALL_PROMPT] * num_rows, max_new_tokens=NUM_TOKENS, stop_token_ids=[],
                       selector=selector)
    return joint_counts(results, V)


# Seeds 10_000 apart: row i uses seed + i, so no two cases (or the tests below) share a row's random stream.
SAMPLED_CASES = [
    pytest.param(dict(temperature=1.0, seed=10_000), 4, False, id="T1"),
    pytest.param(dict(temperature=0.7, top_k=3, seed=20_000), 4, False, id="T0.7-topk3"),
    pytest.param(dict(temperature=1.0, top_p=0.8, seed=30_000), 4, False, id="T1-topp0.8"),
    pytest.param(dict(temperature=0.7, top_p=0.9, min_p=0.05, seed=40_000), 4, True, id="T0.7-topp-minp-argmax"),
    # K = 2 commits d1 and then, when d1 is accepted, the bonus from p_(K-1) within the 3 tokens checked.
    pytest.param(dict(temperature=1.0, seed=50_000), 2, False, id="T1-K2"),
]
# Verify widths changing from step to step (an adaptive policy's choices, plain steps included).
CYCLED_CASE = pytest.param(dict(temperature=1.0, top_p=0.9, seed=60_000), 4, False, id="T1-topp0.9-widths-1234")


@pytest.mark.parametrize("params, block_size, draft_argmax", SAMPLED_CASES + [CYCLED_CASE])
def test_speculative_sampling_matches_target_distribution(small_models, params, block_size, draft_argmax, request):
    target, draft = small_models
    sampling = SamplingParams(**params)
    cycle = "widths" in request.node.callspec.id
    counts = sampled_counts(target, draft, sampling, block_size=block_size, draft_argmax=draft_argmax,
                            cycle_widths=cycle)
    pvalue = goodness_of_fit(counts, exact_joint(target, SMALL_PROMPT, sampling, NUM_TOKENS))
    assert pvalue > ALPHA, f"speculative sampling is not distributed as the target's own (p = {pvalue:.2e})"


class VocabOnlyDrafter(Drafter):
    """A proposal vocabulary without the prompt's ids: q is zero on every other token."""

    def start(self, batch, capacity, prompts=None):
        super().start(batch, capacity)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampling_with_a_proposal_vocabulary_matches_target_distribution(small_models, temperature, top_p):
    """q vanishes outside the draft vocabulary {1, 2}; acceptance and the residual must still give p exactly."""
    target, draft = small_models
    sampling = SamplingParams(temperature=temperature, top_p=top_p, seed=70_000)
    drafter = VocabOnlyDrafter(LoadedDraft(draft, vocab=torch.tensor([1, 2])), target, 4)
    counts = sampled_counts(target, drafter, sampling)
    pvalue = goodness_of_fit(counts, exact_joint(target, SMALL_PROMPT, sampling, NUM_TOKENS))
    assert pvalue > ALPHA, f"sampling with a proposal vocabulary is not the target's distribution (p = {pvalue:.2e})"


def test_target_alone_sampling_matches_target_distribution(small_models):
    """The control: the oracle and the statistics agree on the loop without a draft."""
    target, _ = small_models
    sampling = SamplingParams(temperature=1.0, top_k=4, seed=60_000)
    counts = sampled_counts(target, None, sampling)
    pvalue = goodness_of_fit(counts, exact_joint(target, SMALL_PROMPT, sampling, NUM_TOKENS))
    assert pvalue > ALPHA, f"target-only sampling does not follow the target's distribution (p = {pvalue:.2e})"


def test_speculative_sampling_accepts_and_rejects(small_models):
    """The exactness test above only means something if both paths run: some proposals accepted, some not."""
    target, draft = small_models
    selector = Selector(SamplingParams(temperature=1.0, seed=70_000), num_rows=500)
    results = generate(target, proposer(target, draft, block_size=4), [SMALL_PROMPT] * 500, max_new_tokens=8,
                       stop_token_ids=[], selector=selector)
    histogram = np.sum([r.stats.histogram for r in results], axis=0)
    assert histogram[0] > 0.1 * histogram.sum() and histogram[3] > 0.1 * histogram.sum(), (  # tau 1 and tau K
        f"tau histogram {histogram.tolist()}: the draft should be neither always rejected nor always accepted"
    )


def accept_everything(p, q, draft_tokens, generator=None, limits=None):
    """Wrong: every proposal accepted, so committed proposals follow q instead of p."""
    B, K, _ = p.shape
    uniforms = draw_uniforms(generator, (B, K), p.device)
    num_accepted = torch.full((B,), K - 1, dtype=torch.long)
    return num_accepted, sample_from_uniforms(p[:, K - 1], uniforms[:, -1])


def replace_from_p(p, q, draft_tokens, generator=None, limits=None):
    """Wrong: the replacement after a rejection drawn from p instead of norm(max(0, p - q))."""
    B, K, _ = p.shape
    uniforms = draw_uniforms(generator, (B, K), p.device)
    num_accepted = rejection_accept(p, q, draft_tokens, uniforms[:, :-1])
    return num_accepted, sample_from_uniforms(p[torch.arange(B), num_accepted], uniforms[:, -1])


@pytest.mark.parametrize("wrong_rule", [accept_everything, replace_from_p])
def test_broken_acceptance_fails_the_same_test(small_models, monkeypatch, wrong_rule):
    """The chi-square test has the power to catch a wrong acceptance rule; otherwise its passes prove nothing."""
    target, draft = small_models
    monkeypatch.setattr("blockdraft.decode.selection.speculative_sample", wrong_rule)
    sampling = SamplingParams(temperature=1.0, seed=80_000)
    counts = sampled_counts(target, draft, sampling, num_rows=4000)
    pvalue = goodness_of_fit(counts, exact_joint(target, SMALL_PROMPT, sampling, NUM_TOKENS))
    assert pvalue < ALPHA, f"{wrong_rule.__name__} passed the exactness test (p = {pvalue:.3f}); it has no power"


@pytest.mark.parametrize("params, block_size", [
    pytest.param(dict(temperature=1.0, seed=90_000), 4, id="T1-tree4"),
    pytest.param(dict(temperature=0.7, top_p=0.9, seed=100_000), 3, id="T0.7-topp0.9-tree3"),
])
def test_tree_sampling_matches_target_distribution(small_models, params, block_size):
    """Token trees of K nodes, their guesses tried as point masses (sampling/tree.py): still the target's own."""
    target, draft = small_models
    sampling = SamplingParams(**params)
    counts = sampled_counts(target, draft, sampling, block_size=block_size, tree=True, num_rows=6000)
    pvalue = goodness_of_fit(counts, exact_joint(target, SMALL_PROMPT, sampling, NUM_TOKENS))
    assert pvalue > ALPHA, f"tree sampling is not distributed as the target's own (p = {pvalue:.2e})"


def test_tree_sampling_at_changing_node_counts_matches_target_distribution(small_models):
    """Trees of 1, 2, 3, 4 nodes in turn (an adaptive policy's choices, plain steps included), as unseeded
    sampling runs by default in `generate`: each step's tree is fixed before its draws, so still the target's."""
    target, draft = small_models
    sampling = SamplingParams(temperature=1.0, top_k=4, seed=140_000)
    counts = sampled_counts(target, draft, sampling, block_size=4, tree=True, cycle_widths=True, num_rows=6000)
    pvalue = goodness_of_fit(counts, exact_joint(target, SMALL_PROMPT, sampling, NUM_TOKENS))
    assert pvalue > ALPHA, f"tree sampling at changing node counts is not the target's own (p = {pvalue:.2e})"


def test_broken_tree_sampling_fails_the_same_test(small_models, monkeypatch):
    target, draft = small_models
    monkeypatch.setattr("blockdraft.decode.selection.tree_sample", final_draw_from_p)
    sampling = SamplingParams(temperature=1.0, seed=110_000)
    counts = sampled_counts(target, draft, sampling, tree=True, num_rows=6000)
    pvalue = goodness_of_fit(counts, exact_joint(target, SMALL_PROMPT, sampling, NUM_TOKENS))
    assert pvalue < ALPHA, f"{final_draw_from_p.__name__} passed the exactness test (p = {pvalue:.3f}); no power"


@pytest.mark.parametrize("with_draft, tree", [(False, False), (True, False), (True, True)],
                         ids=["target-alone", "chain-widths-1234", "tree-nodes-1234"])
def test_coupled_sampling_matches_target_distribution(small_models, with_draft, tree):
    """Coupled sampling (Gumbel noise keyed by position, sampling/gumbel.py) through the loop, at widths changing
    every step: each position's noise is fresh, so the joint is the target's whatever the draft proposes."""
    target, draft = small_models
    sampling = SamplingParams(temperature=1.0, top_p=0.9, seed=150_000)
    counts = sampled_counts(target, draft if with_draft else None, sampling, tree=tree, cycle_widths=with_draft,
                            coupled=True, num_rows=6000)
    pvalue = goodness_of_fit(counts, exact_joint(target, SMALL_PROMPT, sampling, NUM_TOKENS))
    assert pvalue > ALPHA, f"coupled sampling is not distributed as the target's own (p = {pvalue:.2e})"


def test_noise_shared_by_positions_fails_the_same_test(small_models, monkeypatch):
    """Noise keyed by the seed alone (every position of a row the same g) makes a row's tokens depend on each
    other beyond p: the joint test must see it."""
    target, _ = small_models
    monkeypatch.setattr("blockdraft.sampling.gumbel.position_seed", lambda seed, position: seed)
    sampling = SamplingParams(temperature=1.0, seed=160_000)
    counts = sampled_counts(target, None, sampling, coupled=True, num_rows=6000)
    pvalue = goodness_of_fit(counts, exact_joint(target, SMALL_PROMPT, sampling, NUM_TOKENS))
    assert pvalue < ALPHA, f"noise shared by positions passed the exactness test (p = {pvalue:.3f}); no power"


def test_exactness_test_detects_a_two_percent_shift(small_models):
    """2% of the mass moved between the two likeliest continuations fails at NUM_ROWS rows.

    One fixed draw here; over 200 draws such a shift was caught 99.5% of the time at alpha 0.01.
    """
    target, _ = small_models
    sampling = SamplingParams(temperature=1.0)
    probs = exact_joint(target, SMALL_PROMPT, sampling, NUM_TOKENS)
    shifted = probs.copy()
    top, other = np.argsort(probs)[-1], np.argsort(probs)[-2]
    shifted[top] -= 0.02
    shifted[other] += 0.02
    counts = np.random.default_rng(0).multinomial(NUM_ROWS, shifted)
    pvalue = goodness_of_fit(counts, probs)
    assert pvalue < ALPHA, f"a 2% shift passed the exactness test at {NUM_ROWS} rows (p = {pvalue:.3f})"
