"""Packed CPU linears: the same bf16 results as F.linear, a copy that never goes stale, a target that uses them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blockdraft.model.packed import PackedLinear, pack_linear, packing_supported
from blockdraft.model.target import Target

from tiny_models import VOCAB, needs_packing, tiny_target



@needs_packing
@pytest.mark.parametrize("rows", [1, 3, 8, 40])
def test_packed_linear_equals_linear_bit_for_bit(rows):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=g).bfloat16()
    bias = torch.randn(96, generator=g).bfloat16()
    x = torch.randn(2, rows, 64, generator=g).bfloat16()
    for b in (None, bias):
        assert torch.equal(PackedLinear(weight, b)(x), F.linear(x, weight, b))
    strided = torch.randn(2, rows + 1, 64, generator=g).bfloat16()[:, 1:]  # a block's rows 1..n
    assert torch.equal(PackedLinear(weight)(strided), F.linear(strided, weight))


@needs_packing
def test_a_weight_changed_in_place_is_packed_again():
    linear = torch.nn.Linear(64, 32, bias=False).bfloat16()
    packed = pack_linear(linear)
    x = torch.randn(1, 64).bfloat16()
    with torch.no_grad():
        linear.weight.mul_(-2.0)  # as a loaded state dict would change it
    assert torch.equal(packed(x), F.linear(x, linear.weight))


def test_float32_and_gradients_keep_the_plain_linear():
    linear = torch.nn.Linear(64, 32)
    assert pack_linear(linear) is linear, "float32 weights are not packed (slower at 1-2 rows, other rounding)"
    if packing_supported(torch.zeros(1, 1, dtype=torch.bfloat16)):
        bf16 = torch.nn.Linear(64, 32).bfloat16()
        x = torch.randn(3, 64).bfloat16().requires_grad_()
        pack_linear(bf16)(x).sum().backward()  # the packed kernel has no backward: F.linear must take it
        assert x.grad is not None


def packed_and_unpacked(family: str, layers: int, rows: int, length: int):
    """A bf16 tiny target as packed and unpacked Targets over the same HF model, with ids, positions and logit
    rows [rows, length] for a forward of every position."""
    plain = tiny_target(family, layers=layers)
    plain.model.bfloat16()
    packed = Target(plain.model, pack_weights=True)
    unpacked = Target(plain.model, pack_weights=False)
    assert packed.packed and not unpacked.packed
    ids = torch.randint(3, VOCAB - 1, (rows, length))
    positions = torch.arange(length).expand(rows, length)
    return plain, packed, unpacked, ids, positions, positions


@needs_packing
def test_packed_target_equals_unpacked_target():
    _, packed, unpacked, ids, positions, rows = packed_and_unpacked("qwen3", layers=3, rows=2, length=7)
    for mode in (torch.no_grad, torch.enable_grad):  # the unchecked products (decoding), and the checked calls
        with mode():
            outs = [t.forward(ids, positions, t.new_cache(2, 16), (0, 2), logit_rows=rows) for t in (packed, unpacked)]
        assert torch.equal(outs[0].logits, outs[1].logits)
        assert torch.equal(outs[0].features, outs[1].features)


@needs_packing
def test_a_packed_target_sees_weights_changed_between_forwards():
    # The packed target checks its packed copies once per forward: a weight changed in place since the last
    # forward must be packed again before this one runs, not read stale.
    plain, packed, unpacked, ids, positions, rows = packed_and_unpacked("llama", layers=2, rows=1, length=5)
    with torch.no_grad():  # as decoding runs: no gradient, so the unchecked products serve the forward
        packed.forward(ids, positions, packed.new_cache(1, 8), logit_rows=rows)
        plain.model.model.layers[1].mlp.down_proj.weight.mul_(-3.0)  # as a loaded state dict would change it
        plain.model.model.layers[0].self_attn.k_proj.weight.mul_(0.5)
        outs = [t.forward(ids, positions, t.new_cache(1, 8), logit_rows=rows) for t in (packed, unpacked)]
    assert torch.equal(outs[0].logits, outs[1].logits)


def test_float32_target_is_not_packed_by_default():
    assert not tiny_target("llama", layers=2).packed


@needs_packing
def test_inference_tensor_weights_pack():
    with torch.inference_mode():  # how the target's weights load
        weight = torch.randn(32, 64).bfloat16()
    x = torch.randn(2, 64).bfloat16()
    assert torch.equal(PackedLinear(weight)(x), F.linear(x, weight))


@needs_packing
def test_a_packed_draft_keeps_its_keys_and_its_outputs():
    from blockdraft.model.packed import PackedLinearModule, pack_module

    from tiny_models import tiny_draft

    target = tiny_target("qwen3")
    plain = tiny_draft(target, block_size=4).bfloat16().eval()
    packed = tiny_draft(target, block_size=4).bfloat16().eval()
    keys = list(packed.state_dict())
    assert pack_module(packed) == 1 + 7 * 2, "fc and the seven projections of each layer"
    assert list(packed.state_dict()) == keys and isinstance(packed.fc, PackedLinearModule)
    features = torch.randn(2, 5, plain.fc.in_features).bfloat16()
    assert torch.equal(packed.project_context(features), plain.project_context(features))
    packed.float()  # a cast after packing: the stale bf16 copy must not be used
    assert torch.equal(packed.project_context(features.float()), plain.float().project_context(features.float()))


@needs_packing
@pytest.mark.parametrize("shape", [(576, 1536), (3072, 576), (960, 576)])  # SmolLM2's down, gate_up and qkv
def test_a_single_row_is_multiplied_as_a_row_of_a_block(shape):
    # oneDNN may take another kernel for one row, summing in another order: a 1536-input product rounded 1 row in
    # 10 apart here, so a one-token step parted from the same token in a verify block (single_row_differs).
    torch.manual_seed(0)
    linear = PackedLinear((torch.randn(*shape) * 0.05).to(torch.bfloat16))
    for rows in (2, 3, 9):
        x = (torch.randn(rows, shape[1]) * 0.05).to(torch.bfloat16)
        block = linear(x)
        for r in range(rows):
            assert torch.equal(linear(x[r : r + 1])[0], block[r]), f"row {r} of {rows} rounds apart when alone"
