"""The training-path forward: tapped features from the frozen target, the draft over every block, the head.

The target is frozen (TRAINING.md §1): its embedding embeds the blocks and its LM head scores them, but
neither is a parameter of anything the optimizer or DDP sees, and neither is ever saved.

Shapes: B sequences, S tokens, A anchors, K block size, D hidden, L tapped layers, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from ..model.draft import DFlashDraftModel
from ..model.target import Target
from .objective import draft_hidden


def freeze_target(target: Target) -> None:
    """No target weight takes a gradient; a tied head must really be the embedding (TRAINING.md §5.7)."""
    target.model.requires_grad_(False)
    target.model.eval()
    tied = getattr(target.config, "tie_word_embeddings", False)
    if tied and target.lm_head.weight is not target.embed_tokens.weight:
        # A loader that expects `lm_head.weight` leaves a tied head random: every CE would score against noise.
        raise ConfigError("the target declares tie_word_embeddings but its lm_head weight is a separate tensor "
                          "(left untied by the loader); reload the target with transformers' from_pretrained so "
                          "the head is the embedding")


def head_weight(target: Target, compute_dtype: torch.dtype) -> torch.Tensor:
    """The frozen LM head [V, D] in the compute dtype (the embedding itself when tied); cast once, not per chunk."""
    return target.lm_head.weight.detach().to(compute_dtype)


@torch.no_grad()
def target_features(target: Target, tokens: torch.Tensor, tap_layer_ids) -> torch.Tensor:
    """Tapped features [B, S, L*D] of tokens [B, S] from an eval-mode, fresh-cache, no-grad target forward.

    no_grad rather than inference_mode: inference tensors could not be saved for the draft's backward.
    """
    B, S = tokens.shape
    positions = torch.arange(S, device=tokens.device).expand(B, S)
    return target.forward(tokens, positions, target.new_cache(B, S), tuple(tap_layer_ids)).features


class BlockForward(nn.Module):
    """The draft over all blocks of a batch: the one module DDP wraps, so only draft weights are synced."""

    def __init__(self, draft: DFlashDraftModel, target: Target) -> None:
        super().__init__()
        self.draft = draft
        self.target = target  # a plain object, not a module: its weights stay outside DDP and the optimizer

    def forward(self, tokens, anchors, keep, features):
        """tokens [B, S], anchors/keep [B, A], features [B, S, L*D] -> final-normed states [B, A*K, D]."""
        dtype = self.draft.fc.weight.dtype

        def embed(ids):
            # Features and embeddings come in the target's dtype; the fp32 draft needs its own (autocast, when
            # on, casts its matmuls down again).
            return self.target.embed_tokens(ids).to(dtype)

        K = self.draft.config.block_size
        return draft_hidden(self.draft, embed, features.to(dtype), tokens, anchors, keep, K)


def autocast(device: torch.device, dtype: torch.dtype | None):
    """bf16 (or fp16) autocast on `device` when dtype is given; a no-op context otherwise."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
