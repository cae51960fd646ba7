"""The int4 target's layer loop as one TorchScript function, for the CPU inference forward.

A one-token step of a 30-layer target calls about 1,500 small ops from Python; each call's argument parsing and
interpreter work cost about as much as the op itself on a 2-core CPU. TorchScript runs the same ops, in the same
order, from its own interpreter: a one-token int4 step of SmolLM2 went from 10.5-11 to 8.5-9 ms here, with the same
bits (tests/test_scripted.py compares it with the Python loop of target.py, which stays the reference and runs
everything this does not: float32 and GPU targets, gradients, unstacked projections).

The products are the int4 ones the Python loop runs unchecked (`torch._weight_int4pack_mm_for_cpu` over Q4_1
blocks, q4.py), q/k/v and gate/up stacked. The packed bf16 products (packed.py) stay with the Python loop:
TorchScript cannot pass the `Scalar?[]` argument of their oneDNN op. The norms are lean.rms_norm's arithmetic, the
MLP's activation is SiLU.

Shapes: B rows, T new tokens, M = B * T, D hidden, H/Hkv heads, Dh head dim, S attention span.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from .lean import rms_norm


# The twins below are the Python loop's own functions as TorchScript compiles them (it compiles only functions of its
# own, without a gradient): the same ops in the same order, so the same bits (tests/test_scripted.py checks each).


def int4_product_twin(x: torch.Tensor, weight: torch.Tensor, scales_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """q4.int4_product's twin: x [M, D] bf16 -> [M, N] over packed weight [N, D / 2] (q4.Q4Weight), the same bits.

    The kernel runs rows in blocks of 4 (a 1536x576 product, 2 threads: 44 us at 4 rows, 85 at 5-8, 125 at 9-12, on
    an Intel Xeon and a Zen 5 alike), so the last row of 4k + 1 runs apart: 5 rows 74 us, 9 rows 113. Rows are
    computed independently (q4.py), so the split changes no bit. Up to 64 rows: past them (a prefill) the copy
    would cost more than a third of a block saves."""
    rows = x.shape[0]
    if 4 < rows <= 64 and rows % 4 == 1:
        return torch.cat([torch._weight_int4pack_mm_for_cpu(x[: rows - 1], weight, group, scales_zeros),
                          torch._weight_int4pack_mm_for_cpu(x[rows - 1:], weight, group, scales_zeros)])
    return torch._weight_int4pack_mm_for_cpu(x, weight, group, scales_zeros)


def rms_norm_twin(x: torch.Tensor, weight: torch.Tensor, eps: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
    """lean.rms_norm's twin: HF's RMSNorm bit for bit, x [..., W] bf16."""
    h = x.to(torch.float32)
    scale = (h * h).sum(-1, keepdim=True).div_(width).add_(eps).rsqrt_()  # [..., 1]
    return weight * h.mul_(scale).to(x.dtype)


def rotate_twin(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """lean.rotate's twin: RoPE of x [B, h, T, Dh] over the tables of lean.rope_tables."""
    return (x * c).add_(x.roll(x.shape[-1] // 2, -1).mul_(s))


def tokenwise_sdpa_twin(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        bias: Optional[torch.Tensor]) -> torch.Tensor:
    """layers.tokenwise_sdpa's twin: q [B, H, T, Dh] over k/v [B, Hkv, S, Dh], each token's rows alone."""
    B, H, T, Dh = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    g = H // Hkv
    out: List[torch.Tensor] = []
    for b in range(B):
        rows = q[b].reshape(Hkv, g, T, Dh).permute(2, 0, 1, 3)  # [T, Hkv, g, Dh]
        mask: Optional[torch.Tensor] = None
        if bias is not None:
            mask = bias[b if bias.shape[0] > 1 else 0].reshape(1, g, T, S).permute(2, 0, 1, 3)  # [T, 1, g, S]
        attended = F.scaled_dot_product_attention(rows, k[b: b + 1].expand(T, Hkv, S, Dh),
                                                  v[b: b + 1].expand(T, Hkv, S, Dh), attn_mask=mask)
        out.append(attended.permute(1, 2, 0, 3).reshape(1, H, T, Dh))
    return torch.cat(out)


def run_layers(x: torch.Tensor, group: int, weights: List[torch.Tensor], scales: List[torch.Tensor],
               norms: List[torch.Tensor], eps: torch.Tensor, width: torch.Tensor, qk_norms: List[torch.Tensor],
               qk_eps: torch.Tensor, qk_width: torch.Tensor, keys: List[torch.Tensor], values: List[torch.Tensor],
               slots: torch.Tensor, start: int, span: int, causal: bool, bias: Optional[torch.Tensor],
               c: torch.Tensor, s: torch.Tensor, B: int, T: int, H: int, Hkv: int, Dh: int,
               taps: List[int], index: Optional[torch.Tensor] = None,
               tokenwise: bool = False) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Every decoder layer over x [M, D] (the embedded tokens; added into in place), or with `index` [M'] (a ragged
    forward, target.Ragged) over the M' rows it names: the products run over those, attention over the
    rectangle they are spread into (zeros elsewhere).

    Per layer l, `weights` and `scales` (int4 codes; scales and zeros) hold its qkv, o, gate_up and down products at
    4l..4l+3, and `norms` its input and post-attention norm weights at 2l, 2l+1 (`qk_norms`: Qwen3's q and k norms
    the same way, or empty). Each layer writes its K/V at `slots` [B, T] (`start` >= 0: every row's slots are
    start..start+T-1) and attends over slots 0..S-1 as `bias` [B, g*T, S] allows (None: all of them), or, when
    `causal`, causally (a prefill from slot 0); `tokenwise`: token by token (layers.tokenwise_sdpa). Returns
    x [M, D] after the last layer and a copy of x after each
    layer in `taps`."""
    M = B * T
    g = H // Hkv
    tapped: List[torch.Tensor] = []
    rows = torch.arange(B, device=x.device).unsqueeze(1)  # [B, 1]
    for layer in range(len(keys)):
        at = 4 * layer
        out = int4_product_twin(rms_norm_twin(x, norms[2 * layer], eps, width), weights[at], scales[at], group)
        if index is not None:
            out = out.new_zeros(M, out.shape[1]).index_copy_(0, index, out)
        qkv = out.view(B, T, H + 2 * Hkv, Dh).transpose(1, 2)  # [B, H + 2Hkv, T, Dh]
        if len(qk_norms) == 0:  # q and k rotated together: the same ops, half the calls
            qk = rotate_twin(qkv[:, : H + Hkv], c, s)  # [B, H + Hkv, T, Dh]
            q, k = qk[:, :H], qk[:, H:]
        else:
            q = rotate_twin(rms_norm_twin(qkv[:, :H], qk_norms[2 * layer], qk_eps, qk_width), c, s)
            k = rotate_twin(rms_norm_twin(qkv[:, H : H + Hkv], qk_norms[2 * layer + 1], qk_eps, qk_width), c, s)
        v = qkv[:, H + Hkv :]  # [B, Hkv, T, Dh]
        if start >= 0:
            keys[layer].narrow(2, start, T).copy_(k)
            values[layer].narrow(2, start, T).copy_(v)
        else:  # a token tree's slots: advanced indices put [B, T] first, so the view written is [B, T, Hkv, Dh]
            keys[layer][rows, :, slots] = k.transpose(1, 2)
            values[layer][rows, :, slots] = v.transpose(1, 2)
        context_k, context_v = keys[layer].narrow(2, 0, span), values[layer].narrow(2, 0, span)  # [B, Hkv, S, Dh]
        if causal:  # layers.causal_sdpa: K/V heads repeated g-fold
            if g > 1:
                context_k, context_v = context_k.repeat_interleave(g, 1), context_v.repeat_interleave(g, 1)
            attended = F.scaled_dot_product_attention(q, context_k, context_v, is_causal=True)
        else:  # layers.grouped_sdpa: the g query heads of a K/V head folded into its rows
            if tokenwise:
                attended = tokenwise_sdpa_twin(q, context_k, context_v, bias)
            else:
                folded = q.reshape(B, Hkv, g * T, Dh)
                attended = F.scaled_dot_product_attention(folded, context_k, context_v, attn_mask=bias)
                attended = attended.reshape(B, H, T, Dh)
        attended = attended.transpose(1, 2).reshape(M, H * Dh)
        if index is not None:
            attended = attended.index_select(0, index)
        x = x.add_(int4_product_twin(attended, weights[at + 1], scales[at + 1], group))
        normed = rms_norm_twin(x, norms[2 * layer + 1], eps, width)
        gate_up = int4_product_twin(normed, weights[at + 2], scales[at + 2], group)
        gate, up = gate_up.chunk(2, -1)  # [M, I] each
        x = x.add_(int4_product_twin(F.silu(gate).mul_(up), weights[at + 3], scales[at + 3], group))
        if layer in taps:
            tapped.append(x.clone())  # later layers add into x
    return x, tapped


def scripted_run_layers():
    """`run_layers` compiled by TorchScript, or the Python function itself where TorchScript cannot compile it (the
    same ops; only the calls cost more)."""
    global _SCRIPTED
    if _SCRIPTED is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TorchScript's deprecation notice: the fallback below covers it
                _SCRIPTED = torch.jit.script(run_layers)
        except Exception:  # noqa: BLE001 - any failure to compile leaves the Python function, which is exact
            _SCRIPTED = run_layers
    return _SCRIPTED


_SCRIPTED = None


def layer_operands(linears: list[dict]) -> tuple[list, list] | None:
    """(weights, scales) for `run_layers` from each layer's projections (`Target.linears`): the qkv, o, gate_up and
    down products of every layer in turn. None unless every one is int4 (q4.Q4Linear), q/k/v and gate/up stacked."""
    from .q4 import Q4Linear

    products = [linear.get(name) for linear in linears for name in ("qkv", "o", "gate_up", "down")]
    if not all(isinstance(p, Q4Linear) for p in products):
        return None
    return [p.weight.packed for p in products], [p.weight.scales_zeros for p in products]


def fixed_operands(target) -> dict | None:
    """The norm weights and constants `run_layers` takes for `target` (a target.Target), or None where its loop does
    not apply: on a GPU, with a norm other than HF's standard RMSNorm (lean.norm_function), norms of differing
    epsilons, an activation other than SiLU, or products other than stacked int4 ones."""
    from .lean import activation_function, norm_function

    layers = target.layers
    if target.device.type != "cpu" or layer_operands(target.linears) is None:
        return None
    if any(activation_function(layer.mlp) is not F.silu for layer in layers):
        return None
    norms = [norm_function(m) for layer in layers for m in (layer.input_layernorm, layer.post_attention_layernorm)]
    attns = [layer.self_attn for layer in layers]
    qk = [norm_function(m) for a in attns for m in (a.q_norm, a.k_norm)] if hasattr(attns[0], "q_norm") else []
    if not all(isinstance(f, partial) and f.func is rms_norm for f in norms + qk):
        return None
    if len({float(f.keywords["eps"]) for f in norms}) > 1 or len({float(f.keywords["eps"]) for f in qk}) > 1:
        return None  # one epsilon is passed for all layers
    first, qk_first = norms[0].keywords, (qk[0].keywords if qk else norms[0].keywords)
    weights, scales = layer_operands(target.linears)
    return dict(weights=weights, scales=scales, norms=[f.keywords["weight"] for f in norms], eps=first["eps"],
                width=first["width"], qk_norms=[f.keywords["weight"] for f in qk], qk_eps=qk_first["eps"],
                qk_width=qk_first["width"])
