"""The one logits -> probs transform, its parameters, and the inverse-CDF draw."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockdraft.errors import InputError
from blockdraft.sampling import SamplingParams, draw_uniforms, logits_to_probs, sample, sample_from_uniforms
from blockdraft.sampling import reference

INF = math.inf
fuzz = settings(max_examples=60, deadline=None, derandomize=True)


def random_logits(seed: int, rows: int, vocab: int) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_temperature_divides_logits():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    for t in (0.5, 1.0, 2.0):
        probs = logits_to_probs(logits, SamplingParams(temperature=t))
        torch.testing.assert_close(probs, torch.softmax(logits / t, dim=-1))
        assert probs.dtype == torch.float32


def test_greedy_is_one_hot_of_first_argmax():
    logits = torch.tensor([[0.0, 3.0, 3.0, -INF], [5.0, 1.0, 2.0, 0.0]])
    probs = logits_to_probs(logits, SamplingParams())
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]], "greedy must pick the first maximal token, as argmax"


def test_half_precision_logits_give_float32_probs():
    probs = logits_to_probs(torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16), SamplingParams(temperature=1))
    assert probs.dtype == torch.float32 and abs(float(probs.sum()) - 1) < 1e-6


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 1.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs > 0).nonzero()[:, 1].tolist() == [1, 3]
    torch.testing.assert_close(probs[0, [1, 3]], torch.softmax(torch.tensor([3.0, 2.0]), dim=0))


def test_top_k_larger_than_vocab_is_a_no_op():
    logits = random_logits(0, 2, 6)
    torch.testing.assert_close(logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=100)),
                               torch.softmax(logits, dim=-1))


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))
    keep = {top_p: (logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=top_p)) > 0)[0].tolist()
            for top_p in (0.01, 0.49, 0.6, 0.79, 0.81, 1.0)}
    assert keep[0.01] == [False, True, False], "the top token must always survive top-p"
    assert keep[0.49] == [False, True, False]
    assert keep[0.6] == [False, True, True]
    assert keep[0.79] == [False, True, True]
    assert keep[0.81] == [True, True, True]
    assert keep[1.0] == [True, True, True]


@fuzz
@given(seed=st.integers(0, 2**31), vocab=st.integers(2, 12), top_p=st.floats(0.01, 0.99))
def test_top_p_nucleus_is_minimal(seed, vocab, top_p):
    logits = random_logits(seed, 1, vocab)
    full = torch.softmax(logits, dim=-1)[0]
    kept = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))[0] > 0
    mass = float(full[kept].sum())
    assert mass >= top_p - 1e-6, "the nucleus must reach top_p"
    assert mass - float(full[kept].min()) < top_p + 1e-6, "without its least likely token it must fall short"
    assert bool(full[kept].min() >= full[~kept].max()) if (~kept).any() else True, "the nucleus is the top tokens"


def test_min_p_keeps_tokens_near_the_top():
    probs_in = torch.tensor([[0.5, 0.26, 0.24]])
    probs = logits_to_probs(torch.log(probs_in), SamplingParams(temperature=1.0, min_p=0.5))
    assert (probs > 0).tolist() == [[True, True, False]]
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.26, 0.0]]) / 0.76)


def test_filters_apply_in_order_top_k_then_renormalised_top_p():
    # top_k=3 leaves [.4, .3, .2], renormalised to [.44, .33, .22]: the first two reach top_p=.75 (.78).
    # Applied to the raw masses instead, .4 + .3 = .7 < .75 would keep a third token.
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.75))
    assert (probs > 0).tolist() == [[True, True, False, False]]


def test_masked_tokens_get_zero_probability():
    probs = logits_to_probs(torch.tensor([[1.0, -INF, 0.5]]), SamplingParams(temperature=0.7))
    assert probs[0, 1] == 0 and abs(float(probs.sum()) - 1) < 1e-6


@pytest.mark.parametrize("temperature", [1e-30, 1e-46, 5e-324])  # the last two round to 0 in float32
def test_tiny_temperature_does_not_overflow(temperature):
    probs = logits_to_probs(torch.tensor([[1.0, 2.0, 0.0]]), SamplingParams(temperature=temperature))
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


@pytest.mark.parametrize("top_p", [1e-6, 1e-300])  # the last one rounds to 0 in float32
def test_a_tiny_top_p_keeps_the_top_token(top_p):
    probs = logits_to_probs(torch.tensor([[1.0, 2.0, 0.0]]), SamplingParams(temperature=0.7, top_p=top_p))
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf), ("temperature", "0.7"),
    ("top_k", -1), ("top_k", 2.5), ("top_k", True),
    ("top_p", 0.0), ("top_p", 1.5), ("top_p", -0.2), ("top_p", math.nan),
    ("min_p", -0.1), ("min_p", 1.0), ("min_p", math.nan),
    ("seed", -1), ("seed", 1.5), ("seed", 2**64),
])
def test_bad_parameter_is_named_in_the_error(field, value):
    with pytest.raises(InputError) as error:
        SamplingParams(**{field: value})
    message = str(error.value)
    assert f"`{field}`" in message and str(value) in message, f"the error must name {field} and the bad value"


def test_greedy_property():
    assert SamplingParams().greedy and not SamplingParams(temperature=0.5).greedy


@pytest.mark.parametrize("bad", [math.nan, INF])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9)])
def test_nan_or_inf_logits_raise(bad, params):
    logits = torch.zeros(2, 4)
    logits[1, 2] = bad
    with pytest.raises(InputError, match="logits contain NaN/inf"):
        logits_to_probs(logits, params)


def test_all_masked_row_raises():
    logits = torch.tensor([[0.0, 1.0], [-INF, -INF]])
    with pytest.raises(InputError, match="all -inf"):
        logits_to_probs(logits, SamplingParams(temperature=1.0))


def test_empty_vocabulary_raises():
    with pytest.raises(InputError, match="V >= 1"):
        logits_to_probs(torch.zeros(2, 0), SamplingParams())


@fuzz
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 5), vocab=st.integers(1, 9),
       masked=st.floats(0.0, 0.8), u=st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=5, max_size=5))
def test_inverse_cdf_matches_reference(seed, rows, vocab, masked, u):
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(rows, vocab, generator=g)
    probs[torch.rand(rows, vocab, generator=g) < masked] = 0.0
    probs[:, 0] += 1e-3  # every row keeps some weight
    uniforms = torch.tensor(u[:rows], dtype=torch.float64)
    fast = sample_from_uniforms(probs, uniforms).tolist()
    slow = [reference.sample_from_uniform(row, ui) for row, ui in zip(probs.tolist(), uniforms.tolist())]
    assert fast == slow
    assert all(probs[r, t] > 0 for r, t in enumerate(fast)), "a zero-weight token must never be drawn"


def test_inverse_cdf_edges():
    probs = torch.tensor([[0.0, 0.25, 0.75, 0.0]] * 3)
    tokens = sample_from_uniforms(probs, torch.tensor([0.0, 0.25, 1.0 - 2**-53], dtype=torch.float64))
    assert tokens.tolist() == [1, 2, 2], "u = 0 takes the first token with weight, u -> 1 the last"


def test_sample_rejects_rows_without_weight():
    with pytest.raises(InputError, match="total"):
        sample_from_uniforms(torch.tensor([[0.0, 0.0]]), torch.tensor([0.5]))
    with pytest.raises(InputError, match="uniforms must have shape"):
        sample_from_uniforms(torch.tensor([[0.5, 0.5]]), torch.tensor([0.5, 0.5]))


def test_sample_frequencies_follow_probs():
    probs = torch.tensor([0.1, 0.6, 0.3]).expand(60_000, 3)
    counts = torch.bincount(sample(probs, torch.Generator().manual_seed(0)), minlength=3) / 60_000
    torch.testing.assert_close(counts, torch.tensor([0.1, 0.6, 0.3]), atol=0.01, rtol=0)


def test_per_row_generators_do_not_depend_on_the_batch():
    def gens(*seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]
    batch = draw_uniforms(gens(1, 2, 3), (3, 4))
    alone = draw_uniforms(gens(2), (1, 4))
    assert torch.equal(batch[1:2], alone), "a row's draws must depend only on its own generator"
    assert torch.equal(batch[2], torch.rand(4, generator=gens(3)[0], dtype=torch.float64))
    with pytest.raises(InputError, match="one torch.Generator per row"):
        draw_uniforms(gens(1, 2), (3, 4))
