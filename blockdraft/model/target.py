"""A functional forward over a Hugging Face Llama/Qwen3-family causal LM, with our per-position cache.

Why not call the HF model directly: the decode loop needs ragged rows (each row at its own position),
rollback by length, the hidden states of a few layers only, and the LM head on chosen rows only. This
module reuses the HF model's own submodules and weights (norms, projections, MLPs, rotary embedding), so
the arithmetic is the target's; tests compare its logits with the HF forward.

Shapes: B batch, T new tokens, D hidden, V vocabulary, H/Hkv heads, Dh head dim, L tapped layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache import KVCache
from ..errors import ConfigError
from ..warm_threads import warm_threads
from . import kernels, q4, q8, scripted
from .draft_q4 import Int4Head
from .lean import activation_function, mlp_function, norm_function, qkv_function, residual, rope_tables
from .layers import TOKENWISE_ROWS, attention_bias, causal_sdpa, grouped_sdpa, tokenwise_sdpa
from .packed import head_linear
from .prompt_path import prompt_products
from .ragged import Ragged
from .span import attention_mask, on_span_grid
from .screen import screen_for
from .weights import build_weights

SUPPORTED_MODEL_TYPES = ("llama", "qwen3", "qwen2", "mistral")
CAUSAL = "causal"  # the attention "bias" of a prefill from slot 0: causal by flag, no mask built


@dataclass
class TargetOutput:
    logits: torch.Tensor | None  # [B, R, V] float32 for the requested rows, or None
    features: torch.Tensor | None  # [B, T, L*D] tapped layer outputs, concatenated in id order


class Target:
    """The verifier: wraps an HF causal LM and its tokenizer.

    `pack_weights` (None: when it pays) runs the linears over weights packed once for the CPU's bf16 kernels
    (packed.py): same results, faster steps, a second copy of the linears in memory. None packs a bf16 CPU
    target whose copy fits in a quarter of the machine's memory.

    `quantized` (per layer, each projection's Q4_1 blocks as the file holds them: io/ read_q4_layers) runs the seven
    projections at the file's own precision, as int4 products at every row count; their bf16 weights are freed.
    """

    def __init__(self, model, tokenizer=None, name: str = "", pack_weights: bool | None = None,
                 quantized: list[dict] | None = None, embedding: q8.Q8Rows | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "")
        self.config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        if self.config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"target `model_type` is {self.config.model_type!r}; blockdraft drives {SUPPORTED_MODEL_TYPES}; "
                "use a Llama- or Qwen3-family causal LM"
            )
        inner = model.model
        self.layers = inner.layers
        self.final_norm = inner.norm
        self.rotary = inner.rotary_emb
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        self.heads = attn.q_proj.out_features // self.head_dim
        # The weights in one representation (weights.py: HF modules, packed bf16, int4, the file's Q8 rows), ready.
        weights = build_weights(model, pack_weights=pack_weights, quantized=quantized, embedding=embedding)
        self.weights = weights
        self.linears, self.head = weights.linears, weights.head
        self.embed_tokens, self.lm_head, self._rows = weights.embed_tokens, weights.lm_head, weights.rows
        self.packed, self.quantized = weights.packed, weights.quantized  # step costs differ (decode/costs.py)
        self._row_heads: dict[tuple, object] = {}  # row_head's cache: key -> head over those vocabulary rows
        self._final_norm = norm_function(self.final_norm)  # lean.py: the module's bits, fewer calls
        # Greedy picks through the int8 screen where it keeps the head's argmax (screen.py), else the whole head.
        self._screen = (screen_for(self.lm_head.weight, self.head, getattr(self.lm_head, "bias", None))
                        if self._rows is None else None)
        # Per layer, what a forward runs, as plain functions (lean.py): with the packed products unchecked (a
        # forward checks every packed copy once, `_unchecked`, instead of at each of its ~120 calls, which cost ~5 %
        # of a one-token step here), and with the checked ones.
        self._plans = {unchecked: [self._layer_plan(layer, linear) for layer, linear in zip(self.layers, linears)]
                       for unchecked, linears in ((True, weights.products), (False, weights.linears))}
        # One layer runner, chosen here: the TorchScript loop (scripted.py) where its operands apply (an int4 CPU
        # target), else the Python loop, the reference.
        self._fixed = scripted.fixed_operands(self)
        self.run_layers = self._scripted_layers if self._fixed is not None else self._layers
        # An int4 target's prompts run over packed bf16 copies of its products where bf16 is native
        # (prompt_path.py): the plans `forward(..., prompt=True)` takes, or None.
        prompt = prompt_products(weights.linears, self.device) if self.quantized else None
        self._prompt_plans = None if prompt is None else [self._layer_plan(layer, linear)
                                                          for layer, linear in zip(self.layers, prompt)]

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ids [N] of the LM head's weight [N, D], in its dtype (the file's rows when they serve it)."""
        return self._rows.rows(ids) if self._rows is not None else self.lm_head.weight.detach()[ids]

    @property
    def screened(self) -> bool:
        """Whether greedy picks go through the int8 screen (screen.py): greedy verify blocks then cost less."""
        return self._screen is not None

    @property
    def tokenwise(self) -> bool:
        """Whether its verify blocks attend token by token (layers.tokenwise_sdpa): on a CPU, an int4 or bf16 target,
        whose products give a row its bits at every row count (the int4 kernel; oneDNN's packed bf16 product, or
        ATen's bf16 kernel where bf16 is emulated), so its blocks then have the bits of its one-token steps. A
        token tree's nodes then take their lanes' slots (decode/tree_slots.py). float32 products (MKL) round a row
        with the rows beside it, so there a block's rows part from their steps anyway and stay folded."""
        return self.device.type == "cpu" and (bool(self.quantized) or self.dtype == torch.bfloat16)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 2**31 - 1))

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self._rows is not None else self.embed_tokens.weight.dtype  # the rows' weight: meta

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self._rows is not None else self.embed_tokens.weight.device

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        capacity = on_span_grid(capacity)  # every span `attention_mask` (span.py) rounds up fits
        return KVCache(self.num_layers, batch, self.kv_heads, capacity, self.head_dim, self.dtype, self.device)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head over final-normed rows [..., D] -> [..., V] float32."""
        with kernels.aten_bf16_products(self.device, self.dtype):
            return self.head(hidden).float()

    def row_head(self, ids: torch.Tensor, dtype: torch.dtype | None = None, int4: bool = False):
        """The LM head restricted to the vocabulary rows ids [N] (a draft's proposal vocabulary), in `dtype` (None:
        the head's own), or as int4 rows (`int4`: an int4 draft's, draft_q4.Int4Head): rows [..., D] -> [..., N],
        packed like the target's own head. Gathering and packing 23k rows costs about as much as two target steps,
        so each distinct ids (and head weight) is built once and kept (the last few)."""
        weight = self.lm_head.weight
        bias = getattr(self.lm_head, "bias", None)
        key = (ids.data_ptr(), ids.numel(), int(ids[0]), int(ids[-1]), int(ids.sum()), weight.data_ptr(),
               None if weight.is_inference() else weight._version, dtype, int4)
        heads = self._row_heads
        if key not in heads:
            if len(heads) >= 4:
                heads.pop(next(iter(heads)))
            rows = self.head_rows(ids)  # [N, D]
            rows = rows if dtype is None else rows.to(dtype)
            if int4 and bias is None and rows.shape[1] % 32 == 0:
                heads[key] = Int4Head(rows)
            else:
                heads[key] = head_linear(rows, None if bias is None else bias.detach()[ids].to(rows.dtype),
                                         pack=self.packed and rows.dtype == torch.bfloat16)
        return heads[key]

    def _unchecked(self, x: torch.Tensor) -> bool:
        """Whether a forward from hidden states x runs the packed products unchecked: x suits them (bf16 on CPU, no
        gradient; every layer keeps x's dtype) and every packed copy is current. Else the checked ones
        (`PackedConcat.__call__`), which fall back to `F.linear` one by one."""
        suits = x.dtype == torch.bfloat16 and x.device.type == "cpu" and not x.requires_grad
        return suits and all(p.ready() for p in self.weights.packs)

    def _layer_plan(self, layer, linear: dict) -> tuple:
        """(norm_in, qkv, o, norm_post, mlp) of one layer over its projections `linear`, for `forward`'s loop."""
        attn = layer.self_attn
        qk_norms = (attn.q_norm, attn.k_norm) if hasattr(attn, "q_norm") else None  # Qwen3: per head, before RoPE
        qkv = qkv_function(self.heads, self.kv_heads, self.head_dim, stacked=linear.get("qkv"),
                           separate=None if "qkv" in linear else (linear["q"], linear["k"], linear["v"]),
                           qk_norms=qk_norms)
        act = activation_function(layer.mlp)
        mlp = (mlp_function(act, linear["down"], gate_up=linear["gate_up"]) if "gate_up" in linear
               else mlp_function(act, linear["down"], gate=linear["gate"], up=linear["up"]))
        return (norm_function(layer.input_layernorm), qkv, linear["o"], norm_function(layer.post_attention_layernorm),
                mlp)

    def _layers(self, x, B, T, c, s, cache, slots, start, span, bias, tap_layer_ids,
                depth: int | None = None, rows: Ragged | None = None, plans: list | None = None,
                tokenwise: bool = False) -> tuple[torch.Tensor, dict]:
        """The decoder layers over x [M, D] in Python, from the per-layer plans (`plans`, else the target's own):
        x after the last layer run (all, or the first `depth`), and {id: x after layer id} for the tapped ids (the
        reference loop; `_scripted_layers` runs the same ops). With `rows` (a ragged forward), x holds only the rows
        it names [M', D]: every product runs over those, and attention over the rectangle they are spread into.
        `tokenwise`: attention token by token (layers.tokenwise_sdpa), else each head's rows folded together."""
        tapped = {}
        attend = tokenwise_sdpa if tokenwise else grouped_sdpa
        wanted = set(tap_layer_ids)
        spread = rows.spread if rows is not None else None
        kept = False  # whether `tapped` holds this x: then the next residual adds into a new tensor
        plans = self._plans[self._unchecked(x)] if plans is None else plans
        for index, (norm_in, qkv, o, norm_post, mlp) in enumerate(plans[:depth]):
            q, k, v = qkv(norm_in(x), B, T, c, s, spread)  # [B, H, T, Dh], [B, Hkv, T, Dh] x 2
            cache.write(index, k, v, slots, start)
            keys, values = cache.read(index, span)  # [B, Hkv, span, Dh] each
            out = causal_sdpa(q, keys, values) if bias is CAUSAL else attend(q, keys, values, bias)
            out = out.transpose(1, 2).reshape(B * T, -1)  # [M, H * Dh]
            x = residual(x, o(out if rows is None else rows.gather(out)), keep=kept)
            x = residual(x, mlp(norm_post(x)), keep=False)
            kept = index in wanted
            if kept:  # id j is the output of decoder layer j (HF hidden_states[j + 1])
                tapped[index] = x
        return x, tapped

    def _scripted_layers(self, x, B, T, c, s, cache, slots, start, span, bias, tap_layer_ids, depth=None,
                         rows: Ragged | None = None, tokenwise: bool = False):
        """`_layers` as one TorchScript call (scripted.py): the same ops, without Python between them. Rows it was
        not built for (features only up to a depth, or not bf16 inference rows) take the Python loop."""
        if depth is not None or not self._unchecked(x):
            return self._layers(x, B, T, c, s, cache, slots, start, span, bias, tap_layer_ids, depth, rows,
                                tokenwise=tokenwise)
        fixed = self._fixed
        wanted = sorted(set(tap_layer_ids))
        causal = bias is CAUSAL  # else bias is the mask's bias, or None where every row sees every slot
        x, copies = scripted.scripted_run_layers()(
            x, q4.BLOCK, fixed["weights"], fixed["scales"], fixed["norms"], fixed["eps"], fixed["width"],
            fixed["qk_norms"], fixed["qk_eps"], fixed["qk_width"], cache.keys, cache.values, slots,
            -1 if start is None else start, span, causal, None if causal else bias, c, s, B, T, self.heads,
            self.kv_heads, self.head_dim, wanted, None if rows is None else rows.index, tokenwise)
        return x, dict(zip(wanted, copies))

    def forward(self, *args, **kwargs) -> TargetOutput:
        """`_forward` (below), its bf16 products where bf16 is emulated run by ATen's own kernel, whose rows keep
        their bits at every row count (kernels.aten_bf16_products)."""
        with kernels.aten_bf16_products(self.device, self.dtype):
            return self._forward(*args, **kwargs)

    def _forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T] absolute positions; slot t of the cache holds position t
        cache: KVCache,
        tap_layer_ids: tuple[int, ...] = (),
        logit_rows: torch.Tensor | None = None,  # [B, R] indices into T, or None for no logits
        slots: torch.Tensor | None = None,  # [B, T] cache slots to write; None: the positions themselves
        block_mask: torch.Tensor | None = None,  # [B, T, T] bool: which new tokens each new token sees
        stop_after_taps: bool = False,  # features only: no layer past the deepest tap runs, no logits
        widths: torch.Tensor | None = None,  # [B]: row b's first widths[b] tokens are real, the rest padding
        prompt: bool = False,  # a decode's prefill: an int4 target runs it over its bf16 copies (prompt_path.py)
        picks_only: bool = False,  # greedy: logits whose first argmax is the head's, others -inf (screen.py)
    ) -> TargetOutput:
        """Causal forward of new tokens against the cache; writes their K/V, leaves lengths alone.

        A query at position p sees cache slots 0..p (slots past a row's own tokens are masked, so stale
        entries from a rolled-back block are never read). A token tree (tree.py) passes `slots` (node i in
        slot s+i, at position s+depth) and `block_mask` (its ancestors): a query then sees the slots before
        the row's first new slot, and the new tokens its mask allows. `stop_after_taps` leaves the layers past
        the deepest tapped one unrun (and their cache unwritten): for features alone (train/feature_store.py).

        `widths` makes the forward ragged: row b's tokens past its first widths[b] are padding, which no product
        runs over (their K/V are written from zeros, their features and logits are zeros). Only attention sees
        the rectangle [B, T]; a padding token must sit where no real token attends to it (after the row's real
        ones, as a chain's). A verify step of rows with proposals of unequal lengths (lookup runs) then costs
        the positions it verifies, not B times the longest.
        """
        if stop_after_taps and (logit_rows is not None or not tap_layer_ids):
            raise ValueError("stop_after_taps returns tapped features only: pass tap_layer_ids and no logit_rows")
        T = input_ids.shape[1]
        if slots is None and block_mask is None and T > 1 and _from_slot_zero(positions):
            bias, span = CAUSAL, T  # a prefill: no [B, T, T] mask
        else:
            mask = attention_mask(positions, slots, block_mask, cache.capacity)  # [B, T, span]
            bias, span = attention_bias(mask, self.heads // self.kv_heads, self.dtype), mask.shape[-1]  # every layer's
        slots = positions if slots is None else slots
        start = KVCache.contiguous_start(slots)  # every row writes slots start..start+T-1: a slice copy
        x = self.embed_tokens(input_ids)  # [B, T, D]
        B, D = x.shape[0], x.shape[-1]
        if x.device.type == "cpu":
            warm_threads()  # the first cos split over threads can round apart (warm_threads.py)
        c, s = rope_tables(*self.rotary(x, positions))  # [B, 1, T, Dh] each, once for all layers
        x = x.view(B * T, D)  # [M, D]: every op but attention works row by row
        rows = Ragged.of(widths, T)
        if rows is not None:
            x = rows.gather(x)  # [M', D]
        depth = max(tap_layer_ids) + 1 if stop_after_taps else None
        if prompt and self._prompt_plans is not None and self._unchecked(x):
            x, tapped = self._layers(x, B, T, c, s, cache, slots, start, span, bias, tap_layer_ids, depth, rows,
                                     plans=self._prompt_plans)
        else:
            # An int4 or bf16 target's products give a row its bits at every row count; its decode steps' few new
            # tokens then attend token by token on a CPU, so a verify row has the bits of the one-token step there.
            tokenwise = self.tokenwise and 1 < T <= TOKENWISE_ROWS and bias is not CAUSAL
            x, tapped = self.run_layers(x, B, T, c, s, cache, slots, start, span, bias, tap_layer_ids, depth, rows,
                                        tokenwise=tokenwise)
        if self.num_layers - 1 in tapped:  # HF's last hidden state is post-norm (docs/format.md §3.1)
            tapped[self.num_layers - 1] = self._final_norm(tapped[self.num_layers - 1])
        head = self._screen if picks_only and self._screen is not None else self.head
        spread = (lambda h: h) if rows is None else rows.spread  # [M', D] -> [M, D]
        tapped = {index: spread(h).view(B, T, D) for index, h in tapped.items()}
        features = torch.cat([tapped[i] for i in tap_layer_ids], dim=-1) if tap_layer_ids else None
        logits = None
        if logit_rows is not None and rows is not None:  # the head over the real rows only
            logits = spread(head(self._final_norm(x)).float()).view(B, T, -1)  # [B, T, V]
            if not _every_row(logit_rows, T):
                logits = logits.gather(1, logit_rows[..., None].expand(-1, -1, logits.shape[-1]))  # [B, R, V]
        elif logit_rows is not None:
            x = x.view(B, T, D)
            picked = x.gather(1, logit_rows[..., None].expand(-1, -1, x.shape[-1]))  # [B, R, D]
            logits = head(self._final_norm(picked)).float()
        return TargetOutput(logits=logits, features=features)


def _every_row(logit_rows: torch.Tensor, T: int) -> bool:
    """Whether logit_rows [B, R] asks for rows 0..T-1 of every row, in order (a verify step's)."""
    return logit_rows.shape[1] == T and torch.equal(logit_rows, torch.arange(T, device=logit_rows.device).expand_as(
        logit_rows))


def _from_slot_zero(positions: torch.Tensor) -> bool:
    """Whether every row of positions [B, T] is 0..T-1: a prefill, whose mask is plainly causal."""
    return torch.equal(positions, torch.arange(positions.shape[1], device=positions.device).expand_as(positions))
