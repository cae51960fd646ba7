"""A draft grown by fresh layers (`train --init-from DRAFT --grow-layers N`): more capacity, the same function at the
first step.

The grown draft keeps every tensor of DRAFT and appends N layers after its last one, before the final norm. Each new
layer starts from the run's seeded random init, except its two output projections (attention `o_proj`, MLP
`down_proj`), which start at zero: both of its residual branches then add exactly nothing, so the grown draft
computes what DRAFT computes, bit for bit, and keeps its acceptance. The first backward reaches the new layer through
those two projections (their gradient is the product of the branch's input and the residual's gradient), and the
rest of the layer learns from the step after. Growing is how a CPU-trained lineage adds capacity without starting
over: a fresh deeper draft would need the lineage's CPU-hours again to catch up.
"""

from __future__ import annotations

import dataclasses

import torch

from ..config import DraftConfig
from ..errors import ConfigError
from ..model.draft import DFlashDraftModel

ZERO_AT_START = ("self_attn.o_proj.weight", "mlp.down_proj.weight")  # a new layer's residual branches' last products


def grown_config(draft_cfg: DraftConfig, extra: int) -> DraftConfig:
    """`draft_cfg` with `extra` more full-attention layers."""
    return dataclasses.replace(draft_cfg, num_hidden_layers=draft_cfg.num_hidden_layers + extra,
                               layer_types=tuple(draft_cfg.layer_types) + ("full_attention",) * extra)


@torch.no_grad()
def load_grown(draft: DFlashDraftModel, tensors: dict[str, torch.Tensor], generator: torch.Generator) -> None:
    """Fill `draft` (built from `grown_config`) with `tensors` of the draft it grows from, its new layers from the
    seeded init with their output projections zero (the module docstring), in place."""
    draft.init_weights(0.02, generator=generator)
    old = 1 + max((int(name.split(".")[1]) for name in tensors if name.startswith("layers.")), default=-1)
    new = tuple(f"layers.{i}." for i in range(old, len(draft.layers)))  # the appended layers' tensor names
    missing, unexpected = draft.load_state_dict(tensors, strict=False)
    stray = list(unexpected) + [name for name in missing if not name.startswith(new)]
    if stray:
        # Any other mismatch means the starting draft is not this draft's shape less its new layers.
        raise ConfigError(f"the starting draft's tensors do not fit the grown draft: {sorted(stray)[:4]}; "
                          "grow a draft of the same width and taps")
    for layer in draft.layers[old:]:
        for name in ZERO_AT_START:
            layer.get_parameter(name).zero_()
