"""The draft's inference forward with fewer ops: `DFlashDraftModel`'s forward, `project_context` and `context_kv`,
bit for bit.

At decode the draft runs one block of K rows, and takes in the few positions the target committed since. Its
products are small, and on a CPU each of the ~70 small ops a layer runs beside them costs a few microseconds to
dispatch whatever its size: at q4 the draft's share of a drafted step was about as much in those ops as in its
products. This runs the same arithmetic with fewer of them:

- q/k/v, k/v and gate/up as one product each where the weights are packed (packed.PackedConcat: the bits of the
  separate products for the rows of a decode step) or int4 of whole row groups (draft_q4.concat_int4: each
  column's own bits); elsewhere the module's own products;
- the q and k norms as one norm over both sets of heads (a norm is per head: the same arithmetic), then one RoPE
  over both, as a roll and a sign-folded sine (lean.rotate: the same products and sum);
- lean.rms_norm's norms, and the attention bias built once per forward instead of once per layer.

Only the inference forward runs here; with gradients enabled (training) every call is the module's own.
tests/test_draft_lean.py compares each output with the module's, bit for bit, in bf16 and float32.

Shapes: B rows, Q block rows, T context positions, D hidden, H/Hkv heads, Dh head dim, I MLP width.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from .draft import DFlashDraftModel
from .layers import attention_bias, grouped_sdpa, rope_cos_sin
from .lean import rms_norm, rope_tables, rotate
from .draft_q4 import concat_int4
from .packed import PackedLinearModule, pack_concat


def lean_draft(model: DFlashDraftModel) -> "LeanDraft":
    """The LeanDraft of `model`, built once per module (its packed products are copies of the weights)."""
    lean = _LEAN.get(model)
    if lean is None:
        lean = _LEAN[model] = LeanDraft(model)
    return lean


_LEAN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class LeanDraft:
    """`model`'s forward, project_context and context_kv with fewer ops (module docstring)."""

    def __init__(self, model: DFlashDraftModel) -> None:
        self.model = model
        cfg = model.config
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.layers = [_Layer(layer, self.heads, self.kv_heads, self.head_dim) for layer in model.layers]

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """Tapped target features [B, T, L*D] -> context rows [B, T, D] (the module's `project_context`)."""
        if torch.is_grad_enabled():
            return self.model.project_context(features)
        norm = self.model.hidden_norm
        return rms_norm(self.model.fc(features), norm.weight, norm.eps)

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer keys/values [B, Hkv, T, Dh] of context rows ctx [B, T, D] at positions [B, T]."""
        if torch.is_grad_enabled():
            return self.model.context_kv(ctx, positions)
        c, s = _rope_tables(self.model.inv_freq, positions, ctx.dtype)
        return [layer.context_kv(ctx, c, s) for layer in self.layers]

    def forward(self, block_embeds: torch.Tensor, positions: torch.Tensor,
                ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> torch.Tensor:
        """The block's final-normed hidden states [B, Q, D] (the module's forward: same arguments)."""
        if torch.is_grad_enabled():
            return self.model(block_embeds, positions, ctx_kv, mask)
        cfg = self.model.config
        x = block_embeds
        if cfg.input_embedding_scale is not None:
            x = x * cfg.input_embedding_scale
        c, s = _rope_tables(self.model.inv_freq, positions, x.dtype)
        bias = attention_bias(mask, self.heads // self.kv_heads, x.dtype)  # the same for every layer
        for layer, (ctx_k, ctx_v) in zip(self.layers, ctx_kv, strict=True):
            x = layer.forward(x, c, s, ctx_k, ctx_v, bias)
        x = rms_norm(x, self.model.norm.weight, self.model.norm.eps)
        if cfg.output_multiplier is not None:
            x = x * cfg.output_multiplier
        return x


def _rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """lean.rope_tables for positions [B, T] as [B, T, 1, Dh]: over the heads of [B, T, h, Dh] rows."""
    cos, sin = rope_tables(*rope_cos_sin(inv_freq, positions, dtype))  # [B, 1, T, Dh] each
    return cos.transpose(1, 2), sin.transpose(1, 2)


class _Layer:
    """One DraftLayer's inference forward (and its context keys/values) over the layer's own weights."""

    def __init__(self, layer, heads: int, kv_heads: int, head_dim: int) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.layer, self.H, self.Hkv, self.Dh = layer, heads, kv_heads, head_dim
        # One product for projections side by side, where the module's own run packed (packed.pack_module); None:
        # the module's products one by one.
        packed = isinstance(attn.q_proj, PackedLinearModule)
        concat = pack_concat if packed else concat_int4  # int4 products (draft_q4.py) stack where they can
        self.qkv = concat([attn.q_proj, attn.k_proj, attn.v_proj])
        self.kv = concat([attn.k_proj, attn.v_proj])
        self.gate_up = concat([mlp.gate_proj, mlp.up_proj])
        if attn.q_norm.eps != attn.k_norm.eps:  # one norm serves both sets of heads
            raise ValueError(f"the q and k norms' eps differ ({attn.q_norm.eps}, {attn.k_norm.eps})")
        self._qk_weight, self._qk_stamp = None, None

    def qk_weight(self) -> torch.Tensor:
        """The q norm's weight for each query head, then the k norm's for each key head [H + Hkv, Dh]; made again
        when either weight changed."""
        q, k = self.layer.self_attn.q_norm.weight, self.layer.self_attn.k_norm.weight
        stamp = tuple((None if w.is_inference() else w._version, w.data_ptr(), w.dtype) for w in (q, k))
        if stamp != self._qk_stamp:
            self._qk_weight = torch.cat([q.detach().expand(self.H, -1), k.detach().expand(self.Hkv, -1)])
            self._qk_stamp = stamp
        return self._qk_weight

    def _projected(self, x: torch.Tensor, fused, linears) -> torch.Tensor:
        """x [B, T, D] through the projections side by side [B, T, sum N]: one product where packed."""
        return fused(x) if fused is not None else torch.cat([linear(x) for linear in linears], dim=-1)

    def context_kv(self, ctx: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed, rotated keys and values of context rows ctx [B, T, D] -> two [B, Hkv, T, Dh]."""
        attn = self.layer.self_attn
        B, T, _ = ctx.shape
        kv = self._projected(ctx, self.kv, (attn.k_proj, attn.v_proj)).view(B, T, 2 * self.Hkv, self.Dh)
        k = rotate(rms_norm(kv[:, :, : self.Hkv], attn.k_norm.weight, attn.k_norm.eps), c, s)  # [B, T, Hkv, Dh]
        return k.transpose(1, 2), kv[:, :, self.Hkv:].transpose(1, 2)

    def forward(self, x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        """x [B, Q, D] -> the layer's output [B, Q, D]; ctx_k/ctx_v [B, Hkv, T, Dh], bias as attention_bias makes
        it for [context; block] (None: every row sees every key)."""
        layer, attn, mlp = self.layer, self.layer.self_attn, self.layer.mlp
        H, Hkv, Dh = self.H, self.Hkv, self.Dh
        B, Q, _ = x.shape
        norm = layer.input_layernorm
        h = rms_norm(x, norm.weight, norm.eps)
        qkv = self._projected(h, self.qkv, (attn.q_proj, attn.k_proj, attn.v_proj)).view(B, Q, H + 2 * Hkv, Dh)
        qk = rotate(rms_norm(qkv[:, :, : H + Hkv], self.qk_weight(), attn.q_norm.eps), c, s)  # [B, Q, H+Hkv, Dh]
        k = torch.cat([ctx_k, qk[:, :, H:].transpose(1, 2)], dim=2)  # [B, Hkv, T+Q, Dh]: context first, block last
        v = torch.cat([ctx_v, qkv[:, :, H + Hkv:].transpose(1, 2)], dim=2)
        out = grouped_sdpa(qk[:, :, :H].transpose(1, 2), k, v, bias)  # [B, H, Q, Dh]
        x = x + attn.o_proj(out.transpose(1, 2).reshape(B, Q, -1))
        norm = layer.post_attention_layernorm
        h = rms_norm(x, norm.weight, norm.eps)
        gate, up = self._projected(h, self.gate_up, (mlp.gate_proj, mlp.up_proj)).chunk(2, dim=-1)
        return x + mlp.down_proj(F.silu(gate) * up)
