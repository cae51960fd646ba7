"""Ragged verify steps (model/target.py `Ragged`, decode/step.py): each row's own nodes through the target's
products, padding never accepted, greedy output the target's and sampling the target's distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blockdraft.decode.generate import generate
from blockdraft.decode.lookup import PromptLookup
from blockdraft.decode.proposers import TargetAlone
from blockdraft.model import target as target_module
from blockdraft.sampling import SamplingParams, accept as accept_module
from blockdraft.sampling.accept import speculative_sample
from blockdraft.decode.selection import Selector

from conftest import COSTS, own_proposer, tiny_draft, tiny_target
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
