"""Building blocks of the draft: RMSNorm, rotary embeddings, SwiGLU, and attention with KV injection.

Shapes: B batch, Q query rows (block slots), T context positions, D hidden, H query heads,
Hkv key/value heads, Dh head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..warm_threads import warm_threads


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as the Llama/Qwen3 targets do."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., D] @ weight[N, D]^T (+ bias) -> [..., N], computed on x as one [M, D] matrix.

    A strided 3-D slice (the block's rows 1..n) sends a bf16 `F.linear` down a CPU path about 25x slower than
    the same rows as a 2-D matrix; every head over chosen rows goes through here.
    """
    flat = x.reshape(-1, x.shape[-1])
    return F.linear(flat, weight, bias).view(*x.shape[:-1], -1)


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """The default RoPE frequencies, theta^(-2i/Dh): [Dh/2] float32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """cos and sin for absolute positions [B, T] -> two [B, T, Dh] tensors (rotate-half layout)."""
    if positions.device.type == "cpu":
        warm_threads()  # the first cos split over threads can round apart (warm_threads.py)
    angles = positions.float()[..., None] * inv_freq.to(positions.device)  # [B, T, Dh/2]
    emb = torch.cat([angles, angles], dim=-1)  # [B, T, Dh]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, Dh] by the angles of cos/sin [B, T, Dh] (rotate-half convention)."""
    cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def grouped_attention(q, k, v, mask: torch.Tensor) -> torch.Tensor:
    """SDPA of q [B, H, Q, Dh] over k/v [B, Hkv, T, Dh] with mask [B, Q, T] bool (True = may attend) -> [B, H, Q, Dh].

    Query head h reads key/value head h // g (g = H/Hkv), as `enable_gqa` does; but the g query heads of a
    group are folded into the row dimension ([B, Hkv, g*Q, Dh]) instead of K/V being repeated g times.
    Same arithmetic, several times faster on CPU for the few-row queries of decoding.
    """
    return grouped_sdpa(q, k, v, attention_bias(mask, q.shape[1] // k.shape[1], q.dtype))


def attention_bias(mask: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The SDPA mask of `grouped_sdpa` for mask [B, Q, T] bool and g = `groups` query heads per key/value head:
    [B, 1, g*Q, T] additive (0 where allowed, -inf elsewhere, in `dtype`: what SDPA makes of a boolean mask on
    every call), or None on CPU when every query sees every key (a one-row decode step; the same bits).

    A forward over many layers builds it once and hands it to each layer's `grouped_sdpa`."""
    if mask.device.type == "cpu" and bool(mask.all()):  # asked on CPU only: a GPU would sync here
        return None
    B, Q, T = mask.shape
    bias = torch.zeros(B, 1, Q, T, dtype=dtype, device=mask.device).masked_fill_(~mask[:, None], float("-inf"))
    return bias[:, :, None].expand(B, 1, groups, Q, T).reshape(B, 1, groups * Q, T)  # row i*Q + t: head i, query t


def grouped_sdpa(q, k, v, bias: torch.Tensor | None) -> torch.Tensor:
    """`grouped_attention` over a mask already made into `attention_bias`: q [B, H, Q, Dh] -> [B, H, Q, Dh]."""
    B, H, Q, Dh = q.shape
    Hkv = k.shape[1]
    folded = q.reshape(B, Hkv, (H // Hkv) * Q, Dh)  # heads h = kv*g + i: row i*Q + t of group kv
    return F.scaled_dot_product_attention(folded, k, v, attn_mask=bias).reshape(B, H, Q, Dh)


# An int4 or bf16 CPU target's forward (Target.tokenwise) of up to this many new tokens a row that is no prompt (a
# verify block, a tree, a ragged run) attends token by token (`tokenwise_sdpa`); longer ones fold their rows.
TOKENWISE_ROWS = 64


def tokenwise_sdpa(q, k, v, bias: torch.Tensor | None) -> torch.Tensor:
    """`grouped_sdpa` with each new token's g query rows in an attention of their own, as a one-token step runs
    them: q [B, H, Q, Dh], k/v [B, Hkv, S, Dh], bias [B, 1, g*Q, S] (attention_bias) or None -> [B, H, Q, Dh].

    The CPU attention kernel multiplies the rows of a (row, K/V head) as one product, whose sums depend on how
    many rows it holds: on an AMD EPYC (Zen 5) a verify block's g*Q folded rows rounded apart from the g rows of
    the one-token step at each position (bf16: 32 of 90 random causal blocks of 2-9 tokens, some row of them;
    float32: 90 of 90; tokens alone: 0), whatever the kernels were capped at. Here a row's Q tokens are the batch of
    one call, each with its own g rows and mask rows, the row's keys and values expanded over them (a view, no
    copy): every token has the bits of its one-token step. It costs more calls inside the kernel (0.7 ms of a
    7.8 ms2-token int4 forward of SmolLM2, 2.2 of 15.2 at 9; docs/design.md §14)."""
    B, H, Q, Dh = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    g = H // Hkv
    out = []
    for b in range(B):
        rows = q[b].reshape(Hkv, g, Q, Dh).permute(2, 0, 1, 3)  # [Q, Hkv, g, Dh]: token t's rows of each head
        mask = None if bias is None else bias[b if bias.shape[0] > 1 else 0].reshape(1, g, Q, S).permute(2, 0, 1, 3)
        keys, values = k[b: b + 1].expand(Q, Hkv, S, Dh), v[b: b + 1].expand(Q, Hkv, S, Dh)
        attended = F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask)  # [Q, Hkv, g, Dh]
        out.append(attended.permute(1, 2, 0, 3).reshape(1, H, Q, Dh))
    return torch.cat(out)


def causal_sdpa(q, k, v) -> torch.Tensor:
    """Causal SDPA of q [B, H, T, Dh] over k/v [B, Hkv, T, Dh] of the same T positions (a prefill from slot 0)
    -> [B, H, T, Dh]. No mask is built: `attention_bias` would hold [B, g*T, T], which grows with the square of
    the prompt, and the fused kernels take a causal mask by flag. K/V heads are repeated (g-fold, linear in T)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); names match Qwen3's `mlp.*` tensors."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class AnchoredBlocks:
    """The training mask in factored form (docs/training.md §2.4): rows are A blocks of K slots; a row sees the
    context positions that `context` allows and every slot of its own block, nothing of the other blocks.

    Same result as the dense [B, Q, T+Q] mask, at O(Q·(T+K)) instead of O(Q·(T+Q)) attention cost.
    """

    context: torch.Tensor  # [B, Q, T] bool, Q = A*K
    block_size: int


def anchored_attention(q, ctx_k, ctx_v, block_k, block_v, mask: AnchoredBlocks) -> torch.Tensor:
    """Attention of q [B, H, Q, Dh] over [context; own block]: ctx_k/ctx_v [B, Hkv, T, Dh], block_k/block_v
    [B, Hkv, Q, Dh] -> [B, H, Q, Dh]. Query head h reads key/value head h // (H/Hkv), as enable_gqa does.

    Written for the backward's memory traffic, the larger part of its cost on a CPU (the score tensors
    [B, Hkv, g, Q, T] run to tens of MB): the mask is an added bias (its gradient passes through, where
    masked_fill's would take another pass), the softmax runs in the scores' dtype (a bf16 softmax computes in
    float32 inside the kernel and rounds once: the probabilities of a float32 softmax rounded to bf16, with no
    float32 copies; its gradient differs from the float32 one by about a bf16 rounding), and the probabilities
    are split rather than sliced (a slice's gradient is a zero-filled full-size tensor). 2x faster forward and
    backward at 96 blocks of 8 over 300 positions in bf16; the same values in float32.
    """
    B, H, Q, Dh = q.shape
    Hkv, T, K = ctx_k.shape[1], ctx_k.shape[2], mask.block_size
    g, A = H // Hkv, Q // K
    q = q.reshape(B, Hkv, g, Q, Dh) * Dh**-0.5
    hidden = torch.zeros(B, 1, 1, Q, T, dtype=q.dtype, device=q.device)
    hidden.masked_fill_(~mask.context[:, None, None], float("-inf"))  # 0 where a row sees a position, else -inf
    s_ctx = torch.einsum("bkgqd,bktd->bkgqt", q, ctx_k) + hidden  # [B, Hkv, g, Q, T]
    own_k, own_v = block_k.reshape(B, Hkv, A, K, Dh), block_v.reshape(B, Hkv, A, K, Dh)
    s_own = torch.einsum("bkgaid,bkajd->bkgaij", q.reshape(B, Hkv, g, A, K, Dh), own_k)  # [B, Hkv, g, A, K, K]
    # One softmax over [context, own block]; the own block is never empty, so no row is all -inf.
    p = torch.cat([s_ctx, s_own.reshape(B, Hkv, g, Q, K)], dim=-1).softmax(-1)
    p_ctx, p_own = p.split([T, K], dim=-1)
    out = torch.einsum("bkgqt,bktd->bkgqd", p_ctx, ctx_v)
    own = torch.einsum("bkgaij,bkajd->bkgaid", p_own.reshape(B, Hkv, g, A, K, K), own_v)
    return (out + own.reshape(B, Hkv, g, Q, Dh)).reshape(B, H, Q, Dh)


class InjectedAttention(nn.Module):
    """Attention whose keys/values are [context; block] and whose queries are the block only.

    The context part comes from the fused target features `ctx` (docs/design.md §1): it is projected once per
    committed position by `context_kv` and cached by the caller; the block part is projected on every call
    and never cached. The mask is supplied by the caller: at inference it only hides padded context slots
    (attention is non-causal), in training it is the anchor-block mask of docs/training.md §2.
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, bias: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """[B, T, n*Dh] -> [B, n, T, Dh]"""
        return x.view(*x.shape[:2], n, self.head_dim).transpose(1, 2)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Normed, rotated keys and values of rows x [B, T, D] -> two [B, Hkv, T, Dh]."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.kv_heads)), cos, sin)
        return k, self._heads(self.v_proj(x), self.kv_heads)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        """x [B, Q, D] (already input-normed), cos/sin [B, Q, Dh], ctx_k/ctx_v [B, Hkv, T, Dh],
        mask [B, Q, T+Q] bool (True = may attend) or AnchoredBlocks (training) -> [B, Q, D]."""
        q = apply_rope(self.q_norm(self._heads(self.q_proj(x), self.heads)), cos, sin)
        block_k, block_v = self.keys_values(x, cos, sin)
        if isinstance(mask, AnchoredBlocks):
            out = anchored_attention(q, ctx_k, ctx_v, block_k, block_v, mask)
        else:
            k = torch.cat([ctx_k, block_k], dim=2)  # [B, Hkv, T+Q, Dh]: context first, block last
            v = torch.cat([ctx_v, block_v], dim=2)
            out = grouped_attention(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class DraftLayer(nn.Module):
    """One pre-norm Qwen3-style layer with KV injection (docs/format.md §3.4)."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = InjectedAttention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.rms_norm_eps, cfg.attention_bias,
        )
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
