"""A draft started from the target's own layers instead of random weights (`train --init-target-layers 28,29`).

Draft layer j takes the weights of target layer ids[j]: its q/k/v/o and MLP projections and its two norms (and
Qwen3's q/k norms where the target has them; a Llama target has none, so the draft's stay at one). The draft's
final norm takes the target's. `fc` starts by selecting the deepest tapped layer (the identity on its columns,
zero elsewhere), so the context the draft layers attend to starts as that layer's output, which is what the
target's later layers read. The draft's block rows still start from embeddings, so the copy is a start, not a
working draft: whether it learns faster than a random start is what the training A/B measures.

Shapes: D hidden, L tapped layers.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..model.draft import DFlashDraftModel
from ..model.target import Target

PROJECTIONS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
NORMS = ("input_layernorm", "post_attention_layernorm")


@torch.no_grad()
def copy_target_layers(draft: DFlashDraftModel, target: Target, layer_ids: tuple[int, ...]) -> None:
    """Overwrite the draft's layers, final norm and fc as the module docstring says, in place."""
    if len(layer_ids) != len(draft.layers):
        raise ConfigError(f"--init-target-layers names {len(layer_ids)} target layers for a draft of "
                          f"{len(draft.layers)}; name one target layer per draft layer")
    if any(not 0 <= i < target.num_layers for i in layer_ids):
        raise ConfigError(f"--init-target-layers {list(layer_ids)} must lie in 0..{target.num_layers - 1}")
    for mine, theirs in zip(draft.layers, (target.layers[i] for i in layer_ids)):
        pairs = [(getattr(getattr(mine, part), name), getattr(getattr(theirs, part), name))
                 for part, names in PROJECTIONS.items() for name in names]
        pairs += [(getattr(mine, name), getattr(theirs, name)) for name in NORMS]
        if hasattr(theirs.self_attn, "q_norm"):
            pairs += [(mine.self_attn.q_norm, theirs.self_attn.q_norm), (mine.self_attn.k_norm, theirs.self_attn.k_norm)]
        for to, source in pairs:
            _copy(to, source)
    _copy(draft.norm, target.final_norm)
    D = draft.config.hidden_size
    deepest = max(range(len(draft.config.target_layer_ids)), key=lambda j: draft.config.target_layer_ids[j])
    draft.fc.weight.zero_()
    draft.fc.weight[:, deepest * D : (deepest + 1) * D] = torch.eye(D)  # [D, L*D]: ctx = that layer's output


def _copy(to: torch.nn.Module, source: torch.nn.Module) -> None:
    for name in ("weight", "bias"):
        mine, theirs = getattr(to, name, None), getattr(source, name, None)
        if mine is None and theirs is None:
            continue
        if mine is None or theirs is None or mine.shape != theirs.shape:
            # A draft shaped otherwise than the target (heads, widths) cannot take its weights.
            raise ConfigError(f"a draft {type(to).__name__} {name} of shape "
                              f"{None if mine is None else list(mine.shape)} cannot take the target's "
                              f"{None if theirs is None else list(theirs.shape)}; train a draft shaped like the target")
        mine.copy_(theirs.to(mine.dtype))
