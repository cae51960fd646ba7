"""draft_lean.py: the draft's inference forward with fewer ops equals the module's, bit for bit."""

from __future__ import annotations

import pytest
import torch

from blockdraft.model.draft_lean import LeanDraft, lean_draft
from blockdraft.model.packed import PackedLinearModule, pack_module, packing_supported
from tiny_models import tiny_draft, tiny_target

CASES = [  # (dtype, packed): float32 runs the module's products; bf16 packed runs the stacked ones
    (torch.float32, False),
    (torch.bfloat16, False),
    pytest.param(torch.bfloat16, True, marks=pytest.mark.skipif(
        not packing_supported(torch.zeros(1, dtype=torch.bfloat16)), reason="no packed bf16 products on this CPU")),
]


def draft_of(dtype: torch.dtype, packed: bool, layers: int = 2):
    draft = tiny_draft(tiny_target("llama"), layers=layers, block_size=8).to(dtype)
    with torch.no_grad():  # norms that are not all ones: their products must be the module's too
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    if packed:
        assert pack_module(draft) > 0
    return draft


def block_inputs(draft, rows: int, context: list[int], K: int = 8, seed: int = 0):
    """A decode block's inputs: rows of `context[b]` cached positions each (padded to the longest), K block rows."""
    g = torch.Generator().manual_seed(seed)
    cfg, dtype = draft.config, draft.fc.weight.dtype
    T = max(context)
    features = torch.randn(rows, T, draft.fc.weight.shape[1], generator=g).to(dtype)
    positions = torch.arange(T).expand(rows, T)
    block = torch.randn(rows, K, cfg.hidden_size, generator=g).to(dtype)
    anchors = torch.tensor(context)
    block_positions = anchors[:, None] + torch.arange(K)
    visible = torch.arange(T)[None, :] < anchors[:, None]  # [B, T]: each row's own context
    mask = torch.cat([visible, visible.new_ones(rows, K)], dim=1)[:, None, :].expand(rows, K, T + K)
    return features, positions, block, block_positions, mask


@pytest.mark.parametrize("dtype,packed", CASES)
@pytest.mark.parametrize("context", [[1], [37], [37, 12]])  # one position, a prompt's, two padded rows
def test_lean_forward_is_the_module_s_bit_for_bit(dtype, packed, context):
    draft = draft_of(dtype, packed)
    lean = LeanDraft(draft)
    features, positions, block, block_positions, mask = block_inputs(draft, len(context), context)
    with torch.inference_mode():
        ctx = draft.project_context(features)
        assert torch.equal(lean.project_context(features), ctx)
        expected_kv = draft.context_kv(ctx, positions)
        got_kv = lean.context_kv(ctx, positions)
        for (k, v), (lk, lv) in zip(expected_kv, got_kv, strict=True):
            assert torch.equal(lk, k) and torch.equal(lv, v)
        expected = draft(block, block_positions, expected_kv, mask)
        assert torch.equal(lean.forward(block, block_positions, expected_kv, mask), expected)


@pytest.mark.parametrize("dtype,packed", CASES)
def test_one_new_position_projects_as_in_a_block(dtype, packed):
    # A step commits one to K+1 positions; the stacked k/v product must give a single row the bits it has alone
    # in the module, whatever oneDNN does with one row (packed.single_row_differs).
    draft = draft_of(dtype, packed)
    features, positions, *_ = block_inputs(draft, 1, [9])
    with torch.inference_mode():
        ctx = draft.project_context(features)
        for t in range(9):
            expected = draft.context_kv(ctx[:, t:t + 1], positions[:, t:t + 1])
            got = lean_draft(draft).context_kv(ctx[:, t:t + 1], positions[:, t:t + 1])
            assert all(torch.equal(a, b) for pair in zip(expected, got) for a, b in zip(*pair))


def test_changed_weights_are_used_at_once():
    # A draft whose weights change after its LeanDraft was built (a loaded state dict, a training step) must not
    # run on a stale copy: the q/k norms' joined weight and the stacked products are made again.
    draft = draft_of(torch.bfloat16, packed=packing_supported(torch.zeros(1, dtype=torch.bfloat16)))
    lean = lean_draft(draft)
    features, positions, block, block_positions, mask = block_inputs(draft, 1, [20])
    with torch.inference_mode():
        before = lean.forward(block, block_positions, draft.context_kv(draft.project_context(features), positions),
                              mask)
    with torch.no_grad():
        draft.layers[0].self_attn.k_norm.weight.mul_(1.5)
        draft.layers[1].mlp.up_proj.weight.mul_(-1.0)
    with torch.inference_mode():
        ctx_kv = draft.context_kv(draft.project_context(features), positions)
        expected = draft(block, block_positions, ctx_kv, mask)
        after = lean.forward(block, block_positions, ctx_kv, mask)
    assert not torch.equal(expected, before), "the change must matter, or this test proves nothing"
    assert torch.equal(after, expected)


def test_training_takes_the_module_s_forward():
    # With gradients the lean forward hands over to the module (the packed products have no backward).
    draft = draft_of(torch.float32, packed=False)
    lean = LeanDraft(draft)
    features, positions, block, block_positions, mask = block_inputs(draft, 1, [6])
    ctx = lean.project_context(features)
    hidden = lean.forward(block, block_positions, lean.context_kv(ctx, positions), mask)
    hidden.float().pow(2).mean().backward()
    assert draft.fc.weight.grad is not None and draft.layers[0].self_attn.q_proj.weight.grad is not None


def test_a_wrong_rotation_is_caught():
    # The comparison above must be able to fail: the same forward with RoPE's sine negated differs.
    draft = draft_of(torch.float32, packed=False)
    lean = LeanDraft(draft)
    features, positions, block, block_positions, mask = block_inputs(draft, 1, [12])
    with torch.inference_mode():
        ctx_kv = draft.context_kv(draft.project_context(features), positions)
        expected = draft(block, block_positions, ctx_kv, mask)
        import blockdraft.model.draft_lean as module

        tables = module._rope_tables
        try:
            module._rope_tables = lambda *a: (lambda c, s: (c, -s))(*tables(*a))
            wrong = lean.forward(block, block_positions, ctx_kv, mask)
        finally:
            module._rope_tables = tables
    assert not torch.equal(wrong, expected)


def test_a_draft_with_packed_products_stacks_them():
    if not packing_supported(torch.zeros(1, dtype=torch.bfloat16)):
        pytest.skip("no packed bf16 products on this CPU")
    draft = draft_of(torch.bfloat16, packed=True)
    assert isinstance(draft.layers[0].self_attn.q_proj, PackedLinearModule)
    layer = LeanDraft(draft).layers[0]
    assert layer.qkv is not None and layer.kv is not None and layer.gate_up is not None
    assert LeanDraft(draft_of(torch.bfloat16, packed=False)).layers[0].qkv is None
