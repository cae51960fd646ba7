"""Ragged verify steps (model/target.py `Ragged`, decode/step.py): each row's own nodes through the target's
products, padding never accepted, greedy output the target's and sampling the target's distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blockdraft.decode.continuation import STRENGTHS, lookup_block, strength_class
from blockdraft.decode.costs import CostModel
from blockdraft.decode.generate import generate
from blockdraft.decode.lookup import PromptLookup
from blockdraft.decode.policy import AdaptiveWidth
from blockdraft.decode.proposers import TargetAlone
from blockdraft.model import target as target_module
from blockdraft.sampling import SamplingParams, accept as accept_module
from blockdraft.sampling.accept import speculative_sample
from blockdraft.decode.selection import Selector

from step_fakes import COSTS, own_proposer
from tiny_models import tiny_draft, tiny_target
from exact_sampling import ALPHA, NUM_ROWS, NUM_TOKENS, exact_joint, goodness_of_fit, joint_counts

PROMPTS = [[1, 5, 9, 13, 17, 5, 9, 13, 17, 5], [3, 4, 3, 4, 3], [7, 8, 9, 10, 11, 12, 13, 14, 15, 7, 8]]


class PlainOnly:
    """A draft width policy that never drafts: every step is plain, with the rows' runs grafted on."""

    def at_batch(self, rows):
        pass

    def choose(self):
        return 1

    def observe(self, width, num_accepted, within=None):
        pass


@pytest.fixture
def ragged_calls(monkeypatch):
    """The widths of every ragged forward (rows of unequal lengths) the test runs."""
    calls = []
    real = target_module.Ragged.of.__func__

    def counting(cls, widths, T):
        rows = real(cls, widths, T)
        if rows is not None:
            calls.append(widths.tolist())
        return rows

    monkeypatch.setattr(target_module.Ragged, "of", classmethod(counting))
    return calls


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_ragged_forward_gives_each_rows_real_tokens_what_the_rectangle_gives(family):
    target = tiny_target(family)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11, 12], [13, 14, 15]]
    widths = torch.tensor([4, 1, 2])  # real tokens of each row's block of T = 4
    T = 4
    caches, outs = [], []
    for ragged in (False, True):
        cache = target.new_cache(len(prompts), 32)
        s = torch.tensor([len(p) for p in prompts])
        for b, p in enumerate(prompts):  # prefill each row alone
            one = target.new_cache(1, 32)
            target.forward(torch.tensor([p]), torch.arange(len(p))[None], one)
            cache.put_rows(torch.tensor([b]), one, 16)
        block = torch.tensor([[20, 21, 22, 23], [24, 25, 26, 27], [28, 29, 30, 31]])
        positions = s[:, None] + torch.arange(T)
        out = target.forward(block, positions, cache, (1, 3), logit_rows=torch.arange(T).expand(3, T),
                             widths=widths if ragged else None)
        caches.append(cache)
        outs.append(out)
    real = torch.arange(T)[None, :] < widths[:, None]  # [B, T]
    torch.testing.assert_close(outs[1].logits[real], outs[0].logits[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[1].features[real], outs[0].features[real], rtol=1e-5, atol=1e-5)
    assert not outs[1].logits[~real].any() and not outs[1].features[~real].any(), "padding gives zeros"
    for b, p in enumerate(prompts):  # the real tokens' K/V, in every layer
        upto = len(p) + int(widths[b])
        for layer in range(target.num_layers):
            torch.testing.assert_close(caches[1].keys[layer][b, :, :upto], caches[0].keys[layer][b, :, :upto],
                                       rtol=1e-5, atol=1e-5)


def test_a_ragged_forward_runs_its_products_over_the_real_tokens_only(monkeypatch):
    target = tiny_target("llama")
    seen = []
    real_linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, *a, **k: seen.append(x.reshape(-1, x.shape[-1]).shape[0]) or real_linear(x, *a, **k))
    cache = target.new_cache(3, 32)
    block = torch.tensor([[20, 21, 22, 23], [24, 25, 26, 27], [28, 29, 30, 31]])
    target.forward(block, torch.arange(4).expand(3, 4) + 5, cache, logit_rows=torch.arange(4).expand(3, 4),
                   widths=torch.tensor([4, 1, 2]))
    assert seen and set(seen) == {7}, f"rows through the products: {sorted(set(seen))}, want the 7 real tokens"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_output_with_ragged_runs_is_the_targets(family, ragged_calls):
    target = tiny_target(family)
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=48, stop_token_ids=[])
    lookup = PromptLookup(8, COSTS)
    guesses = own_proposer(target, tiny_draft(target, block_size=8), PlainOnly(), lookup, tree=True)
    spec = generate(target, guesses, PROMPTS, max_new_tokens=48, stop_token_ids=[])
    assert [s.tokens for s in spec] == [b.tokens for b in base], "a ragged step changed the target's greedy output"
    assert ragged_calls, "the test must run ragged steps"
    assert lookup.steps > 0 and float(lookup.policy.accepted.sum()) > 0, "looked-up tokens must be accepted"
    assert sum(r.stats.tokens for r in spec) > sum(r.stats.steps for r in spec), "steps must commit several tokens"


# Every token of the 6-token vocabulary occurs in the prompt: with min_ngram 1 every row always has a match, and a
# run is cut at its context's end, so rows' runs differ in length.
LOOKUP_PROMPT = [3, 0, 4, 2, 5, 1, 3]


def ragged_counts(target, draft, params, num_rows: int) -> np.ndarray:
    V = target.config.vocab_size
    lookup = PromptLookup(4, COSTS, min_ngram=1)
    results = generate(target, own_proposer(target, draft, PlainOnly(), lookup, tree=True, block_size=4),
                       [LOOKUP_PROMPT] * num_rows, max_new_tokens=NUM_TOKENS, stop_token_ids=[],
                       selector=Selector(params, num_rows=num_rows))
    assert lookup.steps > 0, "the test must exercise lookup runs"
    return joint_counts(results, V)


def test_sampling_with_ragged_runs_matches_target_distribution(small_models, ragged_calls):
    target, draft = small_models
    sampling = SamplingParams(temperature=1.0, seed=140_000)
    counts = ragged_counts(target, draft, sampling, NUM_ROWS)
    assert any(len(set(w)) > 1 for w in ragged_calls), "the test must run steps whose rows' runs differ"
    pvalue = goodness_of_fit(counts, exact_joint(target, LOOKUP_PROMPT, sampling, NUM_TOKENS))
    assert pvalue > ALPHA, f"sampling over ragged runs is not the target's distribution (p = {pvalue:.2e})"


def test_ragged_runs_whose_padding_may_be_accepted_fail_the_same_test(small_models, monkeypatch):
    """A sampler that zeroes the padding's q but does not reject it accepts padding (ratio p / 0) and draws the
    next token from logits that were never computed."""
    def accepting(q, uniforms, limits):
        padding = torch.arange(q.shape[1])[None, :] >= limits[:, None]
        return q.masked_fill(padding[..., None], 0.0), uniforms

    monkeypatch.setattr(accept_module, "limited", accepting)
    target, draft = small_models
    sampling = SamplingParams(temperature=1.0, seed=150_000)
    counts = ragged_counts(target, draft, sampling, 4000)
    pvalue = goodness_of_fit(counts, exact_joint(target, LOOKUP_PROMPT, sampling, NUM_TOKENS))
    assert pvalue < ALPHA, f"accepting padding passed the exactness test (p = {pvalue:.3f}); it has no power"


def test_a_limited_block_is_the_block_of_its_real_proposals():
    """speculative_sample with limits draws what the block cut to each row's limit draws, uniform for uniform."""
    g = torch.Generator().manual_seed(0)
    B, K, V = 64, 5, 7
    p = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    q = torch.softmax(torch.randn(B, K - 1, V, generator=g), -1)
    tokens = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, K - 1)
    limits = torch.randint(0, K, (B,), generator=g)
    uniforms = torch.rand(B, K, generator=g)
    q_cut, u_cut = accept_module.limited(q, uniforms, limits)
    got = accept_module.speculative_sample_from_uniforms(p, q_cut, tokens, u_cut)
    for b in range(B):
        n = int(limits[b])
        alone = accept_module.speculative_sample_from_uniforms(
            p[b : b + 1, : n + 1], q[b : b + 1, :n], tokens[b : b + 1, :n],
            torch.cat([uniforms[b : b + 1, :n], uniforms[b : b + 1, -1:]], dim=1))
        assert (int(got[0][b]), int(got[1][b])) == (int(alone[0]), int(alone[1])), f"row {b}, limit {n}"
    assert int((got[0] == limits).sum()) > 0 and int((got[0] < limits).sum()) > 0, "both outcomes must occur"
    # Through the entry point: the padding is never accepted.
    count, _ = speculative_sample(p, q, tokens, torch.Generator().manual_seed(1), limits=limits)
    assert bool((count <= limits).all())


# ------------------------------------------------------------------ which positions a ragged step verifies

def test_runs_are_priced_by_the_suffix_their_occurrence_shares():
    assert [strength_class(n) for n in (1, 2, 3, 4, 7, 8, 16)] == [0, 0, 0, 1, 1, 2, 2] and len(STRENGTHS) == 3
    shared: list[int] = []
    tokens = torch.tensor([[1, 2, 9, 1, 2, 0, 0, 0, 0, 0], [5, 6, 7, 8, 9, 4, 5, 6, 7, 8],
                           [4, 5, 6, 7, 0, 0, 0, 0, 0, 0]])
    lookup_block(tokens, torch.tensor([5, 10, 4]), 4, shared=shared)
    assert shared == [2, 4, 0], "row 0 repeats [1, 2], row 1 [5, 6, 7, 8], row 2 nothing"
    lookup = PromptLookup(4, COSTS)
    lookup.runs(tokens, torch.tensor([5, 10, 4]))
    assert lookup.row_policies == [lookup.strength_policies[0], lookup.strength_policies[1], None]
    # A ragged step records each row's run in its class (and the pooled prompt record), and only over its run.
    lookup.observe_graft(3, [2, 0, 0], runs=[3, 1, 0], by_row=True)
    weak, middle, strong = lookup.strength_policies
    assert weak.reached[:3].tolist() == [1.0, 1.0, 1.0] and weak.accepted[:3].tolist() == [1.0, 1.0, 0.0]
    assert middle.reached[:3].tolist() == [1.0, 0.0, 0.0] and middle.accepted.sum() == 0
    assert strong.reached.sum() == 0 and lookup.policy.reached[:3].tolist() == [2.0, 1.0, 1.0]


def ragged_lookup(costs, alphas):
    """A PromptLookup whose three rows' runs (8 tokens each) are priced by policies of slot acceptance alphas."""
    lookup = PromptLookup(8, costs)
    lookup.row_policies = [lookup.strength_policies[i] for i in range(3)]
    for policy, alpha in zip(lookup.strength_policies, alphas):
        policy.alpha = lambda alpha=alpha: torch.full((15,), alpha, dtype=torch.float64)
    return lookup


def test_a_ragged_step_verifies_the_likeliest_positions_where_they_pay():
    # Three rows; plain step 10; 1-4 more positions cost 2 (one block of an int4 product), 5-8 another 2.
    costs = CostModel({4: 10.0}, {4: {2: 20.0, 16: 50.0}}, {4: {1: 12.0, 4: 12.0, 8: 14.0, 16: 22.0}})
    draft = AdaptiveWidth(4, costs)
    draft.at_batch(3)
    lookup = ragged_lookup(costs, (0.3, 0.9, 0.99))
    # The 0.99 row's 8 positions (0.99, 0.98, ... 0.92) come first, then the 0.9 row's (0.9, 0.81, 0.73): 10 more
    # positions for 3 + 8.36 tokens in 16 s (0.772 a second) beat 9 (0.770), 11 (0.770), 8 (0.761) and 4 (0.575).
    assert lookup.ragged_lengths(draft, [8, 8, 8], 3) == [0, 2, 8]
    assert lookup.ragged_lengths(draft, [8, 8, 3], 3) == [0, 5, 3], "a shorter run leaves room for the next"
    # Expensive positions: nothing pays, and a row without a run is never given one.
    costs = CostModel({4: 10.0}, {4: {2: 20.0, 16: 50.0}}, {4: {1: 20.0, 16: 200.0}})
    draft = AdaptiveWidth(4, costs)
    draft.at_batch(3)
    assert ragged_lookup(costs, (0.3, 0.9, 0.99)).ragged_lengths(draft, [8, 0, 8], 3) == [0, 0, 0]
    lookup = ragged_lookup(costs, (0.3, 0.9, 0.99))
    lookup.since_graft = 10_000  # a re-try is due: the likeliest candidate alone
    assert lookup.ragged_lengths(draft, [8, 0, 8], 3) == [0, 0, 1]


def test_runs_of_each_strength_start_from_its_measured_acceptance():
    # Plain step 10 over 2 rows; 1 / 4 / 8 more positions cost 2.5 / 6 / 10: a first position pays from 0.52 accepted.
    costs = CostModel({2: 10.0}, {2: {2: 20.0, 16: 50.0}}, {2: {1: 12.5, 4: 16.0, 8: 20.0, 16: 30.0}})
    draft = AdaptiveWidth(4, costs)
    draft.at_batch(2)
    lookup = PromptLookup(8, costs)
    weak, _, strong = lookup.strength_policies
    assert [round(a, 2) for a in strong.alpha()[:3].tolist()] == [0.95, 0.85, 0.85]
    assert weak.alpha()[0].item() == 0.45
    lookup.row_policies = [weak, strong]
    # The strong run's 0.95, 0.81, 0.69, 0.58, 0.50 come first, then the weak one's 0.45 among the strong one's.
    assert lookup.ragged_lengths(draft, [8, 8], 2) == [2, 6], "a strong run is verified from its first step"
    lookup.row_policies = [None, AdaptiveWidth(lookup.width, costs, drafts=False)]  # the even prior they replaced
    assert lookup.ragged_lengths(draft, [0, 8], 2) == [0, 0], "from an even prior it would not have been"
    strong.record(9, [0] * 20, reach=[8] * 20)  # twenty misses: the record, not the prior, decides
    lookup.row_policies = [None, strong]
    assert lookup.ragged_lengths(draft, [0, 8], 2) == [0, 0]
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        AdaptiveWidth(4, costs, prior=(1.0, None))


def test_searches_that_graft_nothing_are_spaced_out_by_the_batch():
    for rows, expected in ((1, [1] * 12), (8, [1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1])):
        lookup, searches = PromptLookup(4, COSTS), []
        for _ in range(len(expected)):
            searches.append(int(lookup.may_search()))
            if searches[-1]:
                lookup.searched(False, rows)
        assert searches == expected, f"{rows} rows"
    lookup.searched(True, 8)
    assert lookup.may_search() and lookup.may_search(), "a graft resets the spacing"


def test_runs_go_on_a_plain_step_where_that_beats_the_drafted_tree_with_its_graft():
    """The width policy weighs the draft's trees against plain steps; where a row has a run, the runs on a plain
    step (a ragged chain, no draft) can beat both. Int4-like costs (a Xeon's, ms): plain 10.4, trees of 2 / 4 / 8 /
    16 nodes 15.7 / 17.1 / 24.3 / 37.7, 1 / 2 / 4 / 8 more ragged positions 11.8 / 12.9 / 18.3 / 25.4. A tree of 4
    nodes expecting 1.89 tokens beats a plain step; a strong run (each slot 95 %) on a plain step beats it with the
    same run grafted (0.287 against 0.276 tokens a ms); a weak one (30 %) does not (0.110 against 0.117). Re-tries,
    which are there to measure the draft, keep their tree."""
    from types import SimpleNamespace

    from blockdraft.decode.policy import TreeWidth
    from blockdraft.decode.proposers import TreeProposer

    costs = CostModel({1: 10.4}, {1: {2: 15.7, 4: 17.1, 8: 24.3, 16: 37.7}},
                      {1: {0: 10.6, 1: 11.8, 2: 12.9, 4: 18.3, 8: 25.4, 16: 40.0}})
    found = (torch.zeros(1, 15, dtype=torch.long), torch.tensor([8]))
    for alpha, ragged in ((0.95, True), (0.3, False)):
        draft = TreeWidth(16, costs, slots=7)
        for hit in [1] * 9 + [0]:
            draft.observe(4, [hit], within={2: [hit], 4: [hit]})
        assert draft.rate(4) > draft.rate(1) * draft.margin, "the tree is the policy's choice over a plain step"
        lookup = PromptLookup(8, costs)
        strength = lookup.strength_policies[0]
        strength.alpha = lambda alpha=alpha: torch.full((15,), alpha, dtype=torch.float64)
        lookup.row_policies, lookup.current = [strength], strength
        proposer = TreeProposer(SimpleNamespace(tap_layer_ids=(), block_size=8), draft, lookup)
        assert proposer._ragged_first(found, 4, 1) == ragged, f"runs accepting {alpha}"
        draft.last_explored = draft.steps  # a re-try step
        assert not proposer._ragged_first(found, 4, 1), "a re-try measures the draft"
