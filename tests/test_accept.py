"""The acceptance math: known answers on hand-built logits, agreement with the loop reference, and
distribution exactness (committed tokens are distributed as p) by a chi-square test."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from blockdraft.errors import InputError
from blockdraft.sampling import (SamplingParams, accept, greedy_accept_length, greedy_step, logits_to_probs,
                                 reference, residual, sample, speculative_sample, speculative_sample_from_uniforms)

INF = math.inf
V = 6
fuzz = settings(max_examples=80, deadline=None, derandomize=True)


def peaked(tokens: list[list[int]], low: float = -10.0) -> torch.Tensor:
    """Logits [B, len, V] with +10 at the given token of each slot and `low` (-10 or -inf) elsewhere."""
    logits = torch.full((len(tokens), len(tokens[0]), V), low)
    for b, row in enumerate(tokens):
        for j, t in enumerate(row):
            logits[b, j, t] = 10.0
    return logits


def one_hot(tokens: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(tokens, V).float()


SAMPLED = SamplingParams(temperature=1.0)


# Hand-built cases. Target argmax per verify slot: slot j predicts slot j+1, so proposals [1, 2, 3] match
# target tokens [1, 2, 3, 4] fully and 4 is the bonus.
TARGET = [[1, 2, 3, 4]]


@pytest.mark.parametrize("low", [-10.0, -INF])
def test_perfect_match_accepts_all_and_adds_bonus(low):
    p = logits_to_probs(peaked(TARGET, low), SAMPLED)
    draft = torch.tensor([[1, 2, 3]])
    num_accepted, bonus = speculative_sample_from_uniforms(p, one_hot(draft), draft, torch.full((1, 4), 0.5))
    assert num_accepted.tolist() == [3] and bonus.tolist() == [4], "a full match must accept K-1 and draw p_(K-1)"
    assert [t.tolist() for t in greedy_step(peaked(TARGET, low), draft)] == [[3], [4]]


def test_first_token_miss_rejects_at_once_and_replaces_with_target_token():
    # d_1 = 5 has p_0 = 0 (masked): rejected for every uniform; the residual of a one-hot q at 5 is p_0 itself.
    p = logits_to_probs(peaked(TARGET, -INF), SAMPLED)
    draft = torch.tensor([[5, 2, 3]])
    for u in (0.0, 0.5, 0.999):
        num_accepted, bonus = speculative_sample_from_uniforms(p, one_hot(draft), draft, torch.full((1, 4), u))
        assert num_accepted.tolist() == [0] and bonus.tolist() == [1]
    assert [t.tolist() for t in greedy_step(peaked(TARGET, -INF), draft)] == [[0], [1]]


def test_mixed_batch_rows_accept_independently():
    target = [[1, 2, 3, 4], [1, 2, 3, 4], [0, 0, 0, 0], [5, 4, 3, 2]]
    draft = torch.tensor([[1, 2, 3], [1, 0, 3], [1, 0, 0], [5, 4, 0]])
    want_accepted, want_bonus = [3, 1, 0, 2], [4, 2, 0, 3]
    p = logits_to_probs(peaked(target, -INF), SAMPLED)
    num_accepted, bonus = speculative_sample_from_uniforms(p, one_hot(draft), draft, torch.full((4, 4), 0.3))
    assert num_accepted.tolist() == want_accepted and bonus.tolist() == want_bonus
    num_accepted, bonus = greedy_step(peaked(target, -10.0), draft)
    assert num_accepted.tolist() == want_accepted and bonus.tolist() == want_bonus


def test_empty_draft_takes_bonus_from_p0():
    p = logits_to_probs(peaked([[3], [2]], -INF), SAMPLED)  # K = 1: only the anchor's slot
    none = torch.zeros(2, 0, dtype=torch.long)
    num_accepted, bonus = speculative_sample(p, torch.zeros(2, 0, V), none, torch.Generator().manual_seed(0))
    assert num_accepted.tolist() == [0, 0] and bonus.tolist() == [3, 2]
    assert [t.tolist() for t in greedy_step(peaked([[3], [2]]), none)] == [[0, 0], [3, 2]]


def test_one_hot_draft_accepts_with_probability_p():
    # q one-hot at d: accept iff u < p(d). p_0 = [.5, .25, .25, 0, ...] and d_1 = 0.
    p = torch.zeros(1, 2, V)
    p[0, 0, :3] = torch.tensor([0.5, 0.25, 0.25])
    p[0, 1, 4] = 1.0
    draft = torch.tensor([[0]])
    accepted = [int(speculative_sample_from_uniforms(p, one_hot(draft), draft, torch.tensor([[u, 0.0]]))[0])
                for u in (0.0, 0.49, 0.5, 0.9)]
    assert accepted == [1, 1, 0, 0]
    # After the rejection the replacement comes from p_0 without token 0: [0, .5, .5].
    _, bonus = speculative_sample_from_uniforms(p, one_hot(draft), draft, torch.tensor([[0.9, 0.6]]))
    assert bonus.tolist() == [2]


def test_residual_is_positive_part_and_falls_back_to_p():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]])
    torch.testing.assert_close(residual(p, q), torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]))


def test_greedy_accept_length_counts_prefix_only():
    draft = torch.tensor([[1, 2, 3], [1, 9, 3], [9, 2, 3]])
    target = torch.tensor([[1, 2, 3, 0], [1, 2, 3, 0], [1, 2, 3, 0]])
    assert greedy_accept_length(draft, target).tolist() == [3, 1, 0], "agreement after a miss must not count"


def test_shape_errors_print_shapes():
    p, q, d, u = torch.rand(2, 4, V), torch.rand(2, 4, V), torch.zeros(2, 3, dtype=torch.long), torch.rand(2, 4)
    with pytest.raises(InputError, match=r"`q` must have shape \[B, K-1, V\] = \[2, 3, 6\].*got \[2, 4, 6\]"):
        speculative_sample_from_uniforms(p, q, d, u)
    with pytest.raises(InputError, match=r"`draft_tokens`.*got \[2, 4\]"):
        speculative_sample_from_uniforms(p, q[:, 1:], torch.zeros(2, 4, dtype=torch.long), u)
    with pytest.raises(InputError, match=r"`uniforms`.*\[2, 4\].*got \[2, 3\]"):
        speculative_sample_from_uniforms(p, q[:, 1:], d, u[:, 1:])
    with pytest.raises(InputError, match=r"\[2, 3\] and \[2, 3\]"):
        greedy_accept_length(d, d)
    with pytest.raises(InputError, match=r"same shape"):
        residual(p, q[:, 1:])


# Fast tensor code against the loop reference, on the same uniforms.

@st.composite
def blocks(draw):
    """Random p, q, proposals and uniforms with the edge cases mixed in: masked tokens, one-hot (argmax)
    proposals, p == q rows (nothing to reject) and K = 1."""
    B, K, vocab = draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(2, 7))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    logits = torch.randn(B, 2 * K, vocab, generator=g) * draw(st.sampled_from([0.5, 2.0, 6.0]))
    logits[torch.rand(B, 2 * K, vocab, generator=g) < draw(st.sampled_from([0.0, 0.3]))] = -INF
    logits[..., 0] = logits[..., 0].clamp(min=0.0)  # keep one token alive per row
    params = SamplingParams(temperature=1.0, top_k=draw(st.sampled_from([0, 2])))
    p, q = logits_to_probs(logits[:, :K], params), logits_to_probs(logits[:, K + 1:], params)
    if draw(st.booleans()):
        q = p[:, :-1].clone()  # the draft agrees with the target exactly
    draft_tokens = sample(q, g) if K > 1 else torch.zeros(B, 0, dtype=torch.long)
    if draw(st.booleans()):
        draft_tokens = q.argmax(dim=-1)
        q = torch.nn.functional.one_hot(draft_tokens, vocab).float()
    return p, q, draft_tokens, torch.rand(B, K, generator=g, dtype=torch.float64)


@fuzz
@given(blocks())
def test_fast_matches_reference(block):
    p, q, draft_tokens, uniforms = block
    fast = speculative_sample_from_uniforms(p, q, draft_tokens, uniforms)
    slow = reference.speculative_sample(p, q, draft_tokens, uniforms)
    assert fast[0].tolist() == slow[0].tolist(), "num_accepted differs from the reference"
    assert fast[1].tolist() == slow[1].tolist(), "bonus token differs from the reference"
    target_tokens = p.argmax(dim=-1)
    assert torch.equal(greedy_accept_length(draft_tokens, target_tokens),
                       reference.greedy_accept_length(draft_tokens, target_tokens))


@fuzz
@given(seed=st.integers(0, 2**31), K=st.integers(1, 5))
def test_one_hot_sampling_equals_greedy_step(seed, K):
    """At temperature 0 p and q are one-hot, and rejection sampling reduces to token matching."""
    g = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(3, K, V, generator=g)
    draft_tokens = torch.where(torch.rand(3, K - 1, generator=g) < 0.7, target_logits[:, :-1].argmax(-1),
                               torch.randint(V, (3, K - 1), generator=g))
    p = logits_to_probs(target_logits, SamplingParams())
    result = speculative_sample(p, one_hot(draft_tokens), draft_tokens, g)
    assert [t.tolist() for t in result] == [t.tolist() for t in greedy_step(target_logits, draft_tokens)]


def test_per_row_generators_make_rows_independent_of_the_batch():
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(torch.randn(3, 4, V, generator=g), dim=-1)
    q = torch.softmax(torch.randn(3, 3, V, generator=g), dim=-1)
    draft_tokens = sample(q, g)

    def run(rows, seeds):
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        return [t.tolist() for t in speculative_sample(p[rows], q[rows], draft_tokens[rows], gens)]

    batch = run([0, 1, 2], [10, 11, 12])
    for r, seed in enumerate([10, 11, 12]):
        assert run([r], [seed]) == [[batch[0][r]], [batch[1][r]]], "a row's result must not depend on its batch"
    # The fixed order: K-1 acceptance uniforms, then the bonus uniform, from one torch.rand(K) per row.
    uniforms = torch.stack([torch.rand(4, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                            for s in [10, 11, 12]])
    assert [t.tolist() for t in speculative_sample_from_uniforms(p, q, draft_tokens, uniforms)] == batch


# Distribution exactness. The target's distribution for position s+1+i is a fixed P[i] (independent of the
# context), and the draft's is a different fixed Q[i]. Then sampling from the target alone gives independent
# tokens x[s+1] ~ P[0], x[s+2] ~ P[1], and speculative decoding must give exactly the same joint law.

K_EXACT, N_EXACT, ALPHA = 3, 200_000, 0.01


def fixed_problem():
    g = torch.Generator().manual_seed(1234)
    P = torch.softmax(torch.randn(K_EXACT + 1, 5, generator=g), dim=-1)  # positions s+1 .. s+K+1
    Q = torch.softmax(torch.randn(K_EXACT + 1, 5, generator=g), dim=-1)
    return P, Q


def committed_tokens(P, Q, start, n, proposals, g):
    """One speculative step for n rows whose verify slot 0 predicts position s+1+start -> tokens [n, K], a [n].

    tokens[:, i] is the committed token of slot i+1, valid for i <= a: d_(i+1) for i < a, the bonus at i = a.
    """
    p = P[start:start + K_EXACT].expand(n, K_EXACT, 5)  # [n, K, V]
    q = Q[start:start + K_EXACT - 1].expand(n, K_EXACT - 1, 5)  # [n, K-1, V]
    if proposals == "argmax":
        draft_tokens = q.argmax(dim=-1)
        q = torch.nn.functional.one_hot(draft_tokens, 5).float()
    else:
        draft_tokens = sample(q, g)
    num_accepted, bonus = speculative_sample(p, q, draft_tokens, g)
    slots = torch.arange(K_EXACT)
    padded = torch.cat([draft_tokens, bonus[:, None]], dim=1)  # [n, K]
    return torch.where(slots == num_accepted[:, None], bonus[:, None], padded), num_accepted


def first_two_tokens(P, Q, proposals):
    """x[s+1] and x[s+2] for N_EXACT independent rows; rows that commit one token take a second step."""
    g = torch.Generator().manual_seed(99)
    tokens, num_accepted = committed_tokens(P, Q, 0, N_EXACT, proposals, g)
    first, second = tokens[:, 0], tokens[:, 1].clone()
    short = num_accepted == 0  # only the bonus committed: x[s+2] comes from the next step, anchored at x[s+1]
    second[short] = committed_tokens(P, Q, 1, int(short.sum()), proposals, g)[0][:, 0]
    return first, second


def p_values(P, Q, proposals):
    first, second = first_two_tokens(P, Q, proposals)
    expected_first = P[0].double() / P[0].double().sum()
    joint = torch.outer(P[0].double(), P[1].double()).flatten()
    pairs = first * 5 + second
    return (chisquare(torch.bincount(first, minlength=5), expected_first * N_EXACT).pvalue,
            chisquare(torch.bincount(pairs, minlength=25), joint / joint.sum() * N_EXACT).pvalue)


@pytest.mark.parametrize("proposals", ["sampled", "argmax"])
def test_committed_tokens_are_distributed_as_p(proposals):
    first, pair = p_values(*fixed_problem(), proposals)
    assert first >= ALPHA, f"x[s+1] is not distributed as P[0] (chi-square p = {first:.2e})"
    assert pair >= ALPHA, f"(x[s+1], x[s+2]) is not distributed as P[0] x P[1] (chi-square p = {pair:.2e})"


def always_accept(p, q, draft_tokens, uniforms):
    return torch.full((p.shape[0],), p.shape[1] - 1)


def absolute_residual(p, q):
    diff = (p - q).abs()
    return diff / diff.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("proposals", ["sampled", "argmax"])
@pytest.mark.parametrize("name, broken", [("rejection_accept", always_accept),
                                          ("residual", absolute_residual),
                                          ("residual", lambda p, q: p)])
def test_exactness_test_catches_broken_math(monkeypatch, proposals, name, broken):
    """The chi-square test has the power to see a wrong acceptance rule or a wrong residual."""
    monkeypatch.setattr(accept, name, broken)
    first, pair = p_values(*fixed_problem(), proposals)
    assert min(first, pair) < ALPHA, f"broken {name} passed the exactness test (p = {first:.2e}, {pair:.2e})"
