"""A draft's products as int4 beside an int4 target (model/draft_q4.py): the quantization's error, stacked
products with each one's bits, and a q4 decode that stays the target's own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from blockdraft.model import q4
from blockdraft.model.draft_q4 import Int4Head, concat_int4, is_int4, quantize_int4, quantize_linears

from step_fakes import assert_drafted_tokens_are_the_targets
from tiny_models import quantized_target, random_prompts, tiny_draft


def test_each_weight_lies_within_half_a_step_of_its_code():
    weight = torch.randn(128, 96, generator=torch.Generator().manual_seed(0)) * 0.05
    weight[3, :32] = 0.25  # a constant group: no spread, coded exactly
    int4 = quantize_int4(weight)
    seen = q4.int4_product(torch.eye(96, dtype=torch.bfloat16), int4).float().t()  # [N, D]: the kernel's weights
    step = (weight.reshape(128, 3, 32).amax(-1) - weight.reshape(128, 3, 32).amin(-1)) / 15  # [N, G]
    bound = step.repeat_interleave(32, dim=1) * 0.5 + weight.abs() * 2 ** -7 + 1e-6  # half a step, bf16 rounding
    assert ((seen - weight).abs() <= bound * 1.05).all(), "a weight coded further than half a step from itself"
    assert torch.equal(seen[3, :32], weight[3, :32]), "a constant group must come back exactly"
    with pytest.raises(ValueError, match="groups take 32"):
        quantize_int4(torch.randn(8, 40))


def test_stacked_int4_products_have_each_products_bits():
    parts = [quantize_linears(nn.Sequential(nn.Linear(64, n, bias=False)))[0] for n in (128, 64, 64)]
    fused = concat_int4(parts)
    x = torch.randn(5, 64).to(torch.bfloat16)
    assert torch.equal(fused(x), torch.cat([p(x) for p in parts], dim=-1)), "a stacked product moved a column"
    odd = quantize_linears(nn.Sequential(nn.Linear(64, 32, bias=False)))[0]
    assert concat_int4([parts[0], odd]) is None, "32 rows cut a packed row group: not stackable"
    assert concat_int4([nn.Linear(64, 64, bias=False)] * 2) is None, "float products are not int4"


def test_an_int4_head_scores_close_to_its_rows():
    generator = torch.Generator().manual_seed(1)
    rows, x = torch.randn(256, 64, generator=generator), torch.randn(32, 64, generator=generator)
    exact, head = x @ rows.t(), Int4Head(rows)(x).float()
    assert head.shape == (32, 256) and (head - exact).abs().max() < 0.1 * exact.abs().max(), "the head drifted"
    assert (head.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.75, "an int4 head ranks apart from its rows"


def test_a_draft_beside_an_int4_target_is_int4_and_the_output_is_the_targets():
    """Placed beside an int4 target, a draft's products become int4 (a copy: the module given is kept), with its
    head rows; it still proposes, and every token is the target's own."""
    from blockdraft.decode.drafter import Drafter
    from blockdraft.decode.options import DecodeOptions
    from blockdraft.io.drafts import LoadedDraft, place

    target, _ = quantized_target(seed=1)
    draft = tiny_draft(target, layers=1, block_size=4)
    placed = place(LoadedDraft(draft, vocab=torch.arange(3, 67)), target)
    assert is_int4(placed.module) and not is_int4(draft), "the draft given was quantized in place"
    assert placed.module.hidden_norm.weight.dtype == torch.bfloat16, "int4 products take bf16 inputs"
    drafter = Drafter(placed, target)
    drafter.start(1, 64, [[5, 6, 7]])
    assert isinstance(drafter.head, Int4Head), "the head rows stayed float"
    options = DecodeOptions(block_size=4, tree=False, adaptive=False, lookup=False)
    assert_drafted_tokens_are_the_targets(target, placed, options, random_prompts([7, 12], seed=2), 20)
