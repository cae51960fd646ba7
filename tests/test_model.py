"""The draft network and the functional target forward against explicit references."""

from __future__ import annotations

import math

import pytest
import torch

from blockdraft.decode.drafter import Drafter
from blockdraft.model.layers import (apply_rope, attention_bias, grouped_attention, linear_rows, rope_cos_sin,
                                     rope_inv_freq)

from tiny_models import tiny_draft, tiny_target


def _explicit_layer_attention(attn, x_normed, ctx, ctx_pos, block_pos, inv_freq):
    """Reference KV injection: K/V = proj([ctx; x]) with norms and RoPE at each row's own position."""
    H, Hkv, Dh = attn.heads, attn.kv_heads, attn.head_dim
    both = torch.cat([ctx, x_normed], dim=1)  # [B, T+Q, D]
    pos = torch.cat([ctx_pos, block_pos], dim=1)
    cos, sin = rope_cos_sin(inv_freq, pos, both.dtype)
    k = attn.k_norm(attn.k_proj(both).view(*both.shape[:2], Hkv, Dh).transpose(1, 2))
    k = apply_rope(k, cos, sin)
    v = attn.v_proj(both).view(*both.shape[:2], Hkv, Dh).transpose(1, 2)
    qc, qs = rope_cos_sin(inv_freq, block_pos, both.dtype)
    q = apply_rope(attn.q_norm(attn.q_proj(x_normed).view(*x_normed.shape[:2], H, Dh).transpose(1, 2)), qc, qs)
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(Dh), dim=-1)  # no mask: non-causal
    out = (weights @ v).transpose(1, 2).reshape(*x_normed.shape[:2], -1)
    return attn.o_proj(out)


def test_linear_rows_equals_linear_on_a_strided_slice():
    torch.manual_seed(0)
    hidden = torch.randn(3, 8, 16)
    weight, bias = torch.randn(40, 16), torch.randn(40)
    rows = hidden[:, 1:4]  # [3, 3, 16], a strided view, as the head's input in a decode step
    out = linear_rows(rows, weight, bias)
    assert out.shape == (3, 3, 40)
    torch.testing.assert_close(out, torch.nn.functional.linear(rows, weight, bias))
    torch.testing.assert_close(linear_rows(rows, weight), rows @ weight.T)


def test_grouped_attention_equals_repeated_kv():
    # Query head h reads kv head h // g (HF's repeat_kv); ragged per-row masks catch a wrong fold of rows.
    torch.manual_seed(3)
    B, H, Hkv, Q, T, Dh = 2, 6, 2, 3, 9, 8
    q, k, v = torch.randn(B, H, Q, Dh), torch.randn(B, Hkv, T, Dh), torch.randn(B, Hkv, T, Dh)
    mask = torch.rand(B, Q, T) < 0.6
    mask[..., 0] = True  # no empty row
    kr, vr = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    scores = (q @ kr.transpose(-1, -2) / math.sqrt(Dh)).masked_fill(~mask[:, None], float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ vr
    assert torch.allclose(grouped_attention(q, k, v, mask), expected, atol=1e-5)


def test_attention_bias_gives_the_boolean_masks_bits():
    # A forward builds the additive mask once for all its layers: the same bits as SDPA's own conversion of the
    # boolean mask, in bf16 and float32; an all-true mask is no mask at all (None), again the same bits.
    torch.manual_seed(4)
    B, H, Hkv, Q, T, Dh = 3, 6, 2, 4, 11, 8
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = (torch.randn(B, n, r, Dh).to(dtype) for n, r in ((H, Q), (Hkv, T), (Hkv, T)))
        mask = torch.rand(B, Q, T) < 0.6
        mask[..., 0] = True
        folded = q.reshape(B, Hkv, 3 * Q, Dh)
        boolean = mask[:, None, None].expand(B, 1, 3, Q, T).reshape(B, 1, 3 * Q, T)
        expected = torch.nn.functional.scaled_dot_product_attention(folded, k, v, attn_mask=boolean)
        assert torch.equal(grouped_attention(q, k, v, mask), expected.reshape(B, H, Q, Dh))
        bias = attention_bias(mask, 3, dtype)
        assert bias.dtype == dtype and bias.shape == (B, 1, 3 * Q, T)
        full = torch.ones(B, Q, T, dtype=torch.bool)
        assert attention_bias(full, 3, dtype) is None
        everything = torch.nn.functional.scaled_dot_product_attention(folded, k, v, attn_mask=torch.ones_like(boolean))
        assert torch.equal(grouped_attention(q, k, v, full), everything.reshape(B, H, Q, Dh))


def test_kv_injection_equals_explicit_concatenation():
    target = tiny_target("qwen3")
    draft = tiny_draft(target, layers=1)
    torch.manual_seed(1)
    B, T, Q, D = 2, 7, 5, 64
    ctx, x = torch.randn(B, T, D), torch.randn(B, Q, D)
    ctx_pos = torch.arange(T).expand(B, T)
    block_pos = T + torch.arange(Q).expand(B, Q)
    layer = draft.layers[0]
    x_normed = layer.input_layernorm(x)
    expected = _explicit_layer_attention(layer.self_attn, x_normed, ctx, ctx_pos, block_pos, draft.inv_freq)
    (ctx_k, ctx_v), = draft.context_kv(ctx, ctx_pos)
    cos, sin = rope_cos_sin(draft.inv_freq, block_pos, x.dtype)
    got = layer.self_attn(x_normed, cos, sin, ctx_k, ctx_v, torch.ones(B, Q, T + Q, dtype=torch.bool))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_rope_frequencies_stay_float32_when_the_draft_is_cast():
    # Training runs the frequencies in float32; a bf16 copy (what `.to(bfloat16)` would make of a plain buffer)
    # turns every position by a slightly different angle than the draft learnt.
    draft = tiny_draft(tiny_target()).to(torch.bfloat16)
    cfg = draft.config
    assert draft.fc.weight.dtype == torch.bfloat16
    assert draft.inv_freq.dtype == torch.float32
    assert torch.equal(draft.inv_freq, rope_inv_freq(cfg.head_dim, cfg.rope_theta))


def test_block_attention_is_non_causal():
    target = tiny_target("llama")
    draft = tiny_draft(target, layers=2)
    torch.manual_seed(2)
    B, T, K, D = 1, 6, 8, 64
    ctx_kv = draft.context_kv(torch.randn(B, T, D), torch.arange(T)[None])
    block = torch.randn(B, K, D)
    positions = T + torch.arange(K)[None]
    mask = torch.ones(B, K, T + K, dtype=torch.bool)
    before = draft(block, positions, ctx_kv, mask)
    changed = block.clone()
    changed[:, -1] += 1.0  # perturb only the last slot
    after = draft(changed, positions, ctx_kv, mask)
    assert (after[:, 0] - before[:, 0]).abs().max() > 1e-4, "slot 0 must see later slots of its block"


def test_features_are_hidden_states_at_id_plus_one():
    target = tiny_target("llama", layers=6)
    ids = torch.randint(0, 90, (2, 9))
    hf = target.model(ids, output_hidden_states=True)
    cache = target.new_cache(2, 16)
    out = target.forward(ids, torch.arange(9).expand(2, 9), cache, (0, 2), logit_rows=torch.arange(9).expand(2, 9))
    expected = torch.cat([hf.hidden_states[1], hf.hidden_states[3]], dim=-1)
    assert torch.equal(out.features, expected), "id j must be HF hidden_states[j + 1], the output of layer j"
    torch.testing.assert_close(out.logits, hf.logits.float(), atol=1e-5, rtol=1e-5)


def test_a_prefill_attends_causally_without_building_a_mask(monkeypatch):
    # A prefill (every row at positions 0..T-1) takes SDPA's causal flag: the [B, g*T, T] mask of the general
    # path grows with the square of the prompt. Its logits and K/V are those of the masked path, which a tree
    # numbering (slots = positions, every node its own ancestor chain) still takes.
    import blockdraft.model.target as target_module

    target = tiny_target("qwen3", layers=3)
    ids = torch.randint(0, 90, (2, 11))
    positions = torch.arange(11).expand(2, 11)
    rows = positions
    masked_cache, causal_cache = target.new_cache(2, 16), target.new_cache(2, 16)
    chain = torch.ones(11, 11, dtype=torch.bool).tril().expand(2, 11, 11)
    masked = target.forward(ids, positions, masked_cache, (1,), logit_rows=rows, slots=positions, block_mask=chain)
    built = []
    monkeypatch.setattr(target_module, "attention_mask", lambda *a: built.append(a) or pytest.fail("mask built"))
    causal = target.forward(ids, positions, causal_cache, (1,), logit_rows=rows)
    assert not built
    torch.testing.assert_close(causal.logits, masked.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(causal.features, masked.features, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(causal_cache.read(2, 11), masked_cache.read(2, 11), atol=1e-5, rtol=1e-5)
    hf = target.model(ids).logits.float()
    torch.testing.assert_close(causal.logits, hf, atol=1e-5, rtol=1e-5)


def test_last_layer_feature_is_post_norm_like_hf():
    target = tiny_target("qwen3", layers=3)
    ids = torch.randint(0, 90, (1, 6))
    hf = target.model(ids, output_hidden_states=True)
    out = target.forward(ids, torch.arange(6)[None], target.new_cache(1, 8), (2,))
    torch.testing.assert_close(out.features, hf.hidden_states[3], atol=1e-6, rtol=1e-6)


def test_cached_context_equals_full_recompute():
    """Feeding the context in two appends gives the same block logits as feeding it at once."""
    target = tiny_target("llama")
    draft = tiny_draft(target, layers=2, block_size=8)
    torch.manual_seed(3)
    features = torch.randn(1, 12, 64 * len(draft.config.target_layer_ids))
    anchor, position = torch.tensor([5]), torch.tensor([12])
    whole = Drafter(draft, target)
    whole.start(1, 32)
    whole.append_context(features, torch.tensor([12]))
    parts = Drafter(draft, target)
    parts.start(1, 32)
    parts.append_context(features[:, :7], torch.tensor([7]))
    parts.append_context(features[:, 7:], torch.tensor([5]))
    torch.testing.assert_close(parts.propose(anchor, position), whole.propose(anchor, position), atol=1e-5, rtol=1e-5)


def test_padded_context_rows_do_not_leak():
    """A row's logits do not depend on what another row of the batch holds past its length."""
    target = tiny_target("llama")
    draft = tiny_draft(target, layers=2, block_size=8)
    torch.manual_seed(4)
    width = 64 * len(draft.config.target_layer_ids)
    feats = torch.randn(2, 10, width)
    batch = Drafter(draft, target)
    batch.start(2, 32)
    batch.append_context(feats, torch.tensor([4, 10]))
    alone = Drafter(draft, target)
    alone.start(1, 32)
    alone.append_context(feats[:1, :4], torch.tensor([4]))
    got = batch.propose(torch.tensor([3, 3]), torch.tensor([4, 10]))[0]
    torch.testing.assert_close(got, alone.propose(torch.tensor([3]), torch.tensor([4]))[0], atol=1e-5, rtol=1e-5)
