"""The training-path forward: tapped features from the frozen target, the draft over every block, the head.

The target is frozen (docs/training.md §1): its embedding embeds the blocks and its LM head scores them, but
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
    """No target weight takes a gradient; a tied head must really be the embedding (docs/training.md §5.7)."""
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
def target_features(target: Target, tokens: torch.Tensor, tap_layer_ids, stop_after_taps: bool = False) -> torch.Tensor:
    """Tapped features [B, S, L*D] of tokens [B, S] from an eval-mode, fresh-cache, no-grad target forward
    (`stop_after_taps`: no layer past the deepest tap runs; the same features).

    no_grad rather than inference_mode: inference tensors could not be saved for the draft's backward.
    """
    B, S = tokens.shape
    positions = torch.arange(S, device=tokens.device).expand(B, S)
    return target.forward(tokens, positions, target.new_cache(B, S), tuple(tap_layer_ids),
                          stop_after_taps=stop_after_taps).features


def split_teacher(tapped: torch.Tensor, feature_width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """tapped [B, S, L*D (+ D)] -> (the draft's features [B, S, L*D], KD teacher states [B, S, D] or None)."""
    if tapped.shape[-1] == feature_width:
        return tapped, None
    return tapped[..., :feature_width], tapped[..., feature_width:]


def feature_scale(features: list[torch.Tensor], floor: float = 1e-2) -> torch.Tensor:
    """Per-dimension RMS [L*D] float32 of tapped features (a list of [S_i, L*D]), position 0 left out.

    Position 0 is the attention sink, whose features can be thousands of times larger than any other's.
    Dimensions quieter than `floor` times the median are floored there, so that noise is not amplified.
    """
    rows = torch.cat([f[1:].float() for f in features if f.shape[0] > 1])  # [N, L*D]
    rms = rows.pow(2).mean(0).sqrt()
    return rms.clamp(min=floor * float(rms.median()))


class BlockForward(nn.Module):
    """The draft over all blocks of a batch: the one module DDP wraps, so only draft weights are synced.

    Feature standardization (optional): the target's tapped features differ in scale by orders of magnitude
    across dimensions (a few "massive" dimensions reach hundreds while most stay near one), so Adam, which
    moves every weight by about the learning rate, changes fc's output hundreds of times faster along those
    dimensions. With a scale s [L*D] set, training sees features / s and learns fc' = fc · diag(s); every
    exported state folds it back (fc = fc' / s), so the saved draft takes raw features exactly as before and
    its architecture and format do not change.
    """

    def __init__(self, draft: DFlashDraftModel, target: Target) -> None:
        super().__init__()
        self.draft = draft
        self.target = target  # a plain object, not a module: its weights stay outside DDP and the optimizer
        self.scale: torch.Tensor | None = None  # [L*D] float32, or None: raw features

    def standardize(self, scale: torch.Tensor, convert_weights: bool) -> None:
        """Train on features / scale from now on; `convert_weights` turns the draft's current (raw-feature)
        fc into fc' so that the function is unchanged (for loaded weights; a fresh init is left as drawn)."""
        self.scale = scale.to(self.draft.fc.weight.device, torch.float32)
        if convert_weights:
            self.from_raw()

    def from_raw(self) -> None:
        """The draft's fc was just loaded from a saved (raw-feature) state: convert it to fc'."""
        if self.scale is not None:
            with torch.no_grad():
                self.draft.fc.weight.mul_(self.scale.to(self.draft.fc.weight.dtype))

    def trained_state(self) -> dict[str, torch.Tensor]:
        """The trained tensors that `export_state` changes (fc'), for an exact resume; empty without a scale."""
        return {} if self.scale is None else {"fc.weight": self.draft.fc.weight.detach()}

    def load_trained_state(self, tensors: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, value in tensors.items():
                self.draft.get_parameter(name).copy_(value)

    def export_state(self) -> dict[str, torch.Tensor]:
        """The draft's state dict for raw features (fc = fc' / s): what every checkpoint and draft stores."""
        state = dict(self.draft.state_dict())
        if self.scale is not None:
            state["fc.weight"] = state["fc.weight"] / self.scale.to(state["fc.weight"].dtype)
        return state

    def forward(self, tokens, anchors, keep, features):
        """tokens [B, S], anchors/keep [B, A], features [B, S, L*D] -> final-normed states [B, A*K, D]."""
        dtype = self.draft.fc.weight.dtype

        def embed(ids):
            # Features and embeddings come in the target's dtype; the fp32 draft needs its own (autocast, when
            # on, casts its matmuls down again).
            return self.target.embed_tokens(ids).to(dtype)

        K = self.draft.config.block_size
        features = features.to(dtype) if self.scale is None else features.to(dtype) / self.scale.to(dtype)
        return draft_hidden(self.draft, embed, features, tokens, anchors, keep, K)


def autocast(device: torch.device, dtype: torch.dtype | None):
    """bf16 (or fp16) autocast on `device` when dtype is given; a no-op context otherwise."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
