"""The greedy screen (model/screen.py): an int8 copy of the head and a bound on its error find every token that may
be the argmax; those are computed exactly. Its first argmax must be the whole head's, ties and near-ties included;
a screen without its bound must fail the same checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blockdraft.model import kernels, screen
from blockdraft.model.screen import GreedyScreen, screen_for, subset_keeps_bits
from blockdraft.model.target import Target
from blockdraft.sampling.argmax import first_argmax

from tiny_models import tiny_target

CPU = torch.device("cpu")
needs_int8 = pytest.mark.skipif(not kernels._int8_runs(), reason="torch's CPU int8 product does not run here")


@pytest.fixture
def emulated(monkeypatch):
    """A CPU without native bf16 products: bf16 runs ATen's kernel, where the screen applies."""
    paths = kernels.CpuPaths("test", True, native_bf16=False, packed_bf16=False, int4=True)
    monkeypatch.setattr(kernels, "cpu_paths", lambda: paths)


def head_of(weight: torch.Tensor):
    return lambda x: F.linear(x, weight)


def near_ties(vocab: int = 4096, hidden: int = 64, rows: int = 48, seed: int = 0):
    """A head of clusters of 8 rows a bf16 step or two apart (and some exact twins), and rows [M, D] that each
    favour one cluster: the int8 copy (a step of about 1/127 of a row's largest weight) cannot order a cluster,
    the exact head can."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(vocab // 8, hidden, generator=generator).mul_(0.1)
    weight = centres.repeat_interleave(8, dim=0)  # [V, D]
    weight += torch.randn(vocab, hidden, generator=generator).mul_(1e-3)
    weight[1::8] = weight[0::8]  # exact twins: the first among equals must win
    weight = weight.bfloat16()
    favourite = torch.randint(0, vocab // 8, (rows,), generator=generator) * 8
    x = weight[favourite].float() * 8 + torch.randn(rows, hidden, generator=generator).mul_(0.05)
    return weight, x.bfloat16()


@needs_int8
def test_its_first_argmax_is_the_heads_on_ties_and_near_ties(emulated):
    for seed in range(3):
        weight, x = near_ties(seed=seed)
        with kernels.aten_bf16_products(CPU, torch.bfloat16):
            whole = F.linear(x, weight).float()
            screened = GreedyScreen(weight, head_of(weight))(x)
        assert torch.equal(first_argmax(screened), first_argmax(whole))
        kept = torch.isfinite(screened)
        assert torch.equal(screened[kept], whole[kept]), "every kept logit is the head's own bits"
        assert kept.sum(dim=1).max() < weight.shape[0] // 8, "the screen keeps few tokens"


@needs_int8
def test_without_its_bound_the_screen_picks_wrongly(emulated, monkeypatch):
    """The check above can fail: a screen that keeps only the int8 copy's best tokens misses near-ties."""
    weight, x = near_ties()
    broken = GreedyScreen(weight, head_of(weight))
    broken.per_norm = torch.zeros_like(broken.per_norm)
    broken.widest = 0.0
    monkeypatch.setattr(screen, "RELATIVE", 0.0)
    monkeypatch.setattr(screen, "ABSOLUTE", 0.0)
    with kernels.aten_bf16_products(CPU, torch.bfloat16):
        whole = F.linear(x, weight).float()
        assert not torch.equal(first_argmax(broken(x)), first_argmax(whole))


@needs_int8
def test_a_row_of_nan_or_too_many_candidates_takes_the_whole_head(emulated, monkeypatch):
    weight, x = near_ties(rows=4)
    x[1, 3] = float("nan")
    monkeypatch.setattr(screen, "MAX_KEPT", 0)  # every row keeps more than none: the whole head for all
    with kernels.aten_bf16_products(CPU, torch.bfloat16):
        whole = F.linear(x, weight).float()
        assert torch.allclose(GreedyScreen(weight, head_of(weight))(x), whole, rtol=0, atol=0, equal_nan=True)
    monkeypatch.setattr(screen, "MAX_KEPT", 512)
    with kernels.aten_bf16_products(CPU, torch.bfloat16):
        screened = GreedyScreen(weight, head_of(weight))(x)
    assert torch.allclose(screened[1], whole[1], rtol=0, atol=0, equal_nan=True)
    assert first_argmax(screened)[1] == first_argmax(whole)[1]


@needs_int8
def test_only_a_bf16_head_multiplied_by_atens_kernel_is_screened(emulated, monkeypatch):
    weight, _ = near_ties()
    assert screen_for(weight, head_of(weight)) is not None
    assert screen_for(weight.float(), head_of(weight.float())) is None, "float32"
    assert screen_for(weight, head_of(weight), bias=torch.zeros(weight.shape[0])) is None, "a bias"
    shuffled = lambda x: F.linear(x, weight.flip(0))  # noqa: E731 - a head whose rows are not the weight's
    assert not subset_keeps_bits(shuffled, weight) and screen_for(weight, shuffled) is None
    native = kernels.CpuPaths("test", True, native_bf16=True, packed_bf16=True, int4=True)
    monkeypatch.setattr(kernels, "cpu_paths", lambda: native)
    assert screen_for(weight, head_of(weight)) is None, "native bf16: oneDNN's packed head"


@needs_int8
def test_a_targets_greedy_picks_are_its_heads(emulated):
    target = Target(tiny_target("llama").model.to(torch.bfloat16))
    assert target._screen is not None
    ids = torch.randint(3, target.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(12).expand(3, 12)
    rows = torch.arange(12).expand(3, 12)
    whole = target.forward(ids, positions, target.new_cache(3, 16), logit_rows=rows).logits
    picks = target.forward(ids, positions, target.new_cache(3, 16), logit_rows=rows, picks_only=True).logits
    assert torch.equal(first_argmax(picks), first_argmax(whole))
    assert not torch.isfinite(picks).all(), "the screen ran"
