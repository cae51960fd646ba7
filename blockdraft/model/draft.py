"""The DFlash draft network (docs/design.md §1, docs/format.md §2-3).

It has no embedding and no LM head: the caller embeds the block with the target's `embed_tokens` and
scores the output with the target's `lm_head`. Tensor names match docs/format.md §2 so that published
DFlash v1 checkpoints load as they are.

Shapes: B batch, T context positions, Q block rows, D hidden, L tapped target layers, Hkv kv heads, Dh head dim.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from .layers import DraftLayer, RMSNorm, rope_cos_sin, rope_inv_freq


class DFlashDraftModel(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        sliding = [t for t in cfg.layer_types if t != "full_attention"]
        if sliding:
            # A sliding layer is causal with a window; running it non-causally would silently change its outputs.
            raise ConfigError(
                f"`layer_types` contains {sorted(set(sliding))}; blockdraft runs only full_attention draft layers; "
                "use a draft trained with full attention"
            )
        self.config = cfg
        n_features = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n_features * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def _apply(self, fn, recurse: bool = True):
        """`.to()`, `.half()` and the like cast every floating buffer; the RoPE frequencies stay float32, as in
        training (bf16 ones are off by up to 0.33 % for theta 1e5: over a radian of angle at 1,000 tokens)."""
        super()._apply(fn, recurse)
        self.inv_freq = rope_inv_freq(self.config.head_dim, self.config.rope_theta).to(self.inv_freq.device)
        return self

    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """HF-style init: linear weights normal(0, std), biases zero, norm weights one."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """Fuse tapped target features [B, T, L*D] into the context rows ctx [B, T, D]."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer keys/values of the context rows ctx [B, T, D] at absolute positions [B, T].

        Returns one ([B, Hkv, T, Dh], [B, Hkv, T, Dh]) pair per layer. These are what the draft context cache
        stores: each committed position is projected once and reused by every later block.
        """
        cos, sin = rope_cos_sin(self.inv_freq, positions, ctx.dtype)
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def forward(
        self,
        block_embeds: torch.Tensor,  # [B, Q, D] target-embedded [anchor, MASK...] rows
        positions: torch.Tensor,  # [B, Q] absolute positions of the block rows
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],  # per layer ([B, Hkv, T, Dh], same)
        mask: torch.Tensor,  # [B, Q, T+Q] bool, True where a block row may attend
    ) -> torch.Tensor:
        """Run the draft layers over the block; returns the final-normed hidden states [B, Q, D]."""
        cfg = self.config
        x = block_embeds
        if cfg.input_embedding_scale is not None:
            x = x * cfg.input_embedding_scale
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)
        for layer, (ctx_k, ctx_v) in zip(self.layers, ctx_kv, strict=True):
            x = layer(x, cos, sin, ctx_k, ctx_v, mask)
        x = self.norm(x)
        if cfg.output_multiplier is not None:
            x = x * cfg.output_multiplier
        return x
