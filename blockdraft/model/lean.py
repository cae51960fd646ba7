"""The target layer's small ops with fewer dispatches: the same arithmetic as the Hugging Face modules, bit for bit.

A one-token step of a 135M target runs about 35 small ops per layer besides its products; on a CPU each costs a
few microseconds to dispatch whatever its size, which summed to about as much as the products themselves. These
functions compute what the HF modules compute with fewer temporaries (in-place where nothing else reads the
tensor) and without a module call per norm. Each is checked against the module it replaces in
tests/test_lean.py: equal bits in bfloat16 and float32, so the target alone and every verify block keep one
arithmetic (docs/design.md §14).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

# HF RMSNorm classes whose forward is weight * (x32 * rsqrt(mean(x32^2) + eps)).to(dtype) exactly. Others (Gemma's
# 1 + weight, say) keep their own module call.
STANDARD_RMS_NORMS = ("LlamaRMSNorm", "Qwen3RMSNorm", "Qwen2RMSNorm", "MistralRMSNorm")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float | torch.Tensor,
             width: torch.Tensor | None = None) -> torch.Tensor:
    """HF's Llama RMSNorm of x [..., D], bit for bit: weight * (h * rsqrt(mean(h^2) + eps)).to(x.dtype), h = x in
    float32. The mean is HF's own arithmetic (its CPU kernel sums, then divides by D); the division, the epsilon
    and the rsqrt share one buffer. `eps` and `width` (D) may come as float32 0-dim tensors (`norm_function`): an
    op with a Python number costs about twice one with a tensor here. h is scaled in place when it is a copy (a
    bf16 x) that no gradient needs."""
    h = x.to(torch.float32)  # [..., D]
    scale = (h * h).sum(-1, keepdim=True).div_(h.shape[-1] if width is None else width).add_(eps).rsqrt_()  # [..., 1]
    # h is x itself for a float32 x, and h * h saved it for a backward when it needs a gradient: scale a copy then.
    h = h * scale if h is x or h.requires_grad else h.mul_(scale)
    return weight * h.to(x.dtype)


def norm_function(module: torch.nn.Module):
    """x [..., D] -> normed x: `rms_norm` over the module's weight when it is a standard HF RMSNorm, else the module
    itself (its own forward, whatever it computes)."""
    if type(module).__name__ in STANDARD_RMS_NORMS and hasattr(module, "variance_epsilon"):
        weight = module.weight
        constant = partial(torch.tensor, dtype=torch.float32, device=weight.device)
        return partial(rms_norm, weight=weight, eps=constant(module.variance_epsilon),
                       width=constant(float(weight.shape[-1])))
    return module


def activation_function(mlp: torch.nn.Module):
    """The MLP's activation: `F.silu` when it is a SiLU module (torch's, or transformers' SiLUActivation, whose
    forward is F.silu), one call fewer per layer; else the module."""
    return F.silu if type(mlp.act_fn).__name__ in SILU_MODULES else mlp.act_fn


SILU_MODULES = ("SiLU", "SiLUActivation")


def gated(act, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up [..., I], multiplied into act's fresh output when no gradient needs it."""
    h = act(gate)
    return h * up if h.requires_grad else h.mul_(up)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, T, Dh] -> [B, 1, T, Dh] each, sin with its first half negated: then
    `rotate(x, cos, sin)` is RoPE's x * cos + rotate_half(x) * sin bit for bit ((-a) * b == a * (-b)),
    without rotate_half's negation and concatenation in every layer."""
    half = sin.shape[-1] // 2
    signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
    return cos[:, None], signed[:, None]


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE of x [B, H, T, Dh]: x * cos + swap_halves(x) * signed_sin (cos, signed_sin [B, 1, T, Dh], the sine's
    first half negated), bit for bit HF's x * cos + rotate_half(x) * sin; the sum and the second product land in
    fresh buffers, in place."""
    turned = x.roll(x.shape[-1] // 2, dims=-1)  # [B, H, T, Dh] the two halves swapped
    if turned.requires_grad:
        return x * cos + turned * signed_sin
    return (x * cos).add_(turned.mul_(signed_sin))


def residual(x: torch.Tensor, update: torch.Tensor, keep: bool) -> torch.Tensor:
    """x + update [B, T, D], added into x unless `keep` (something still reads this x: a tapped layer's output) or
    a gradient needs it."""
    if keep or x.requires_grad or update.requires_grad:
        return x + update
    return x.add_(update)


def qkv_function(heads: int, kv_heads: int, head_dim: int, stacked=None, separate=None, qk_norms=None):
    """A layer's attention inputs: (x [M, D] normed, B, T, cos, signed_sin [B, 1, T, Dh], spread) -> q [B, H, T, Dh]
    and k [B, Hkv, T, Dh] rotated, v [B, Hkv, T, Dh]; M = B * T rows, or with `spread` (a ragged forward:
    target.Ragged) the M' real ones, which each product's output is spread from. Over one `stacked` product (q, k
    and v rows in one weight) or the `separate` (q, k, v) products; `qk_norms` (Qwen3's per-head q and k norms)
    before RoPE."""
    H, Hkv, Dh = heads, kv_heads, head_dim

    def qkv(x, B, T, c, s, spread=None):
        if spread is None:
            def spread(y):
                return y
        if stacked is not None:
            out = spread(stacked(x)).view(B, T, H + 2 * Hkv, Dh).transpose(1, 2)  # [B, H + 2Hkv, T, Dh]
            if qk_norms is None:  # q and k rotated together: the same ops, half the calls
                qk = rotate(out[:, : H + Hkv], c, s)  # [B, H + Hkv, T, Dh]
                return qk[:, :H], qk[:, H:], out[:, H + Hkv :]
            q, k, v = out[:, :H], out[:, H : H + Hkv], out[:, H + Hkv :]
        else:
            q_proj, k_proj, v_proj = separate
            q = spread(q_proj(x)).view(B, T, H, Dh).transpose(1, 2)  # [B, H, T, Dh]
            k = spread(k_proj(x)).view(B, T, Hkv, Dh).transpose(1, 2)  # [B, Hkv, T, Dh]
            v = spread(v_proj(x)).view(B, T, Hkv, Dh).transpose(1, 2)
        if qk_norms is not None:
            q, k = qk_norms[0](q), qk_norms[1](k)
        return rotate(q, c, s), rotate(k, c, s), v

    return qkv


def mlp_function(act, down, gate_up=None, gate=None, up=None):
    """A layer's gated MLP, x [M, D] -> down(act(gate(x)) * up(x)) [M, D], over one stacked `gate_up` product
    (gate rows, then up rows) or the two products."""

    def mlp(x):
        if gate_up is not None:
            g, u = gate_up(x).chunk(2, dim=-1)  # [M, I] each
        else:
            g, u = gate(x), up(x)
        return down(gated(act, g, u))

    return mlp
