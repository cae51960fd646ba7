"""Drafts in the form transformers' own DFlash path loads: config and tensor names, both ways.

transformers (>= 5.15) runs a DFlash draft as `target.generate(..., assistant_model=draft,
speculation_type="dflash")`, where `draft` is its `MuseGlimmerAssistantModel` (model_type
`muse_glimmer_assistant`). That class computes what docs/format.md §3 specifies for full-attention layers,
with three differences of form:

- config: flat `block_size`, `mask_token_id`, `target_layer_ids`; RoPE only as `rope_parameters`; an integer
  `sliding_window` even when no layer slides (its config class refuses null);
- tensors: `fc` is `encoder.fc`, `hidden_norm` is `encoder.output_norm_enc`; every other name is ours;
- no q/k/v/o biases and no z-lab extras (`input_embedding_scale` ...): drafts that need them are refused.

Its config class keeps keys it does not know as attributes, so the export also carries `num_target_layers`,
`vocab_size`, `dflash_config` (for vLLM and SGLang, which read the mask id there) and our provenance; reading a
folder back needs the first two, which transformers itself never writes. Pure functions only: files are
read and written by blockdraft.io.checkpoint.
"""

from __future__ import annotations

import copy
from typing import Any

from ..config import DraftConfig
from ..config_fields import ARCHITECTURE, EXTRA_FIELDS
from ..checks import export_layer_problems, raise_collected

HF_MODEL_TYPE = "muse_glimmer_assistant"
HF_ARCHITECTURE = "MuseGlimmerAssistantModel"
# Our name -> transformers' name; the other tensors are named alike.
HF_TENSOR_NAMES = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
NATIVE_TENSOR_NAMES = {hf: ours for ours, hf in HF_TENSOR_NAMES.items()}


def is_transformers_config(data: Any) -> bool:
    """Whether a parsed config.json is in transformers' DFlash form (not ours)."""
    return isinstance(data, dict) and data.get("model_type") == HF_MODEL_TYPE


def export_problems(cfg: DraftConfig) -> list[str]:
    """What transformers' class would run differently from blockdraft; each names the field and the fix."""
    problems = export_layer_problems(cfg, "transformers' DFlash class")
    if cfg.rope_scaling is not None:
        problems.append(f"`rope_scaling` is {cfg.rope_scaling!r}; the export carries default RoPE only; "
                        "export a draft with null `rope_scaling`")
    problems += [f"`dflash_config.{name}` is {getattr(cfg, name)!r}; transformers' DFlash class does not apply "
                 "it; export a draft without it" for name in EXTRA_FIELDS if getattr(cfg, name) is not None]
    return problems


def to_transformers_config(cfg: DraftConfig, dtype: str) -> dict[str, Any]:
    """config.json for `MuseGlimmerAssistantModel.from_pretrained` (every field its config class declares)."""
    raise_collected(export_problems(cfg))
    out = {
        "architectures": [HF_ARCHITECTURE],
        "model_type": HF_MODEL_TYPE,
        "block_size": cfg.block_size,
        "mask_token_id": cfg.mask_token_id,
        "target_layer_ids": list(cfg.target_layer_ids),
        "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "attention_bias": False, "attention_dropout": 0.0,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "layer_types": list(cfg.layer_types),
        # Read only by sliding layers, of which there are none; the config class refuses null, and a window
        # as long as the context is the honest "no window".
        "sliding_window": cfg.max_position_embeddings,
        # The class defaults are another model's ids (200000...), outside this target's vocabulary.
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
        "num_target_layers": cfg.num_target_layers,
        "vocab_size": cfg.vocab_size,
        "dflash_config": {"block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id,
                          "target_layer_ids": list(cfg.target_layer_ids)},
        "tie_word_embeddings": False,
        "dtype": dtype,
    }
    if cfg.provenance is not None:
        out["blockdraft"] = copy.deepcopy(cfg.provenance)
    return out


def from_transformers_config(data: dict[str, Any]) -> dict[str, Any]:
    """Our config.json layout (docs/format.md §4) of a transformers-form config, for `DraftConfig.from_dict`.

    Values are moved, never invented: a key the file lacks stays absent and `DraftConfig.from_dict` names it.
    """
    problems = [f"`{name}` is required, got none; transformers' DFlash config does not carry it; add the "
                f"target's {what} as `{name}` to config.json"
                for name, what in (("num_target_layers", "decoder layer count"), ("vocab_size", "vocabulary size"))
                if data.get(name) is None]
    # Without the list transformers makes every layer sliding (its class default); guessing full would differ.
    if data.get("layer_types") is None:
        problems.append("`layer_types` is required, got none; transformers then runs every layer as sliding "
                        "attention; add the draft's list (e.g. [\"full_attention\", ...]) to config.json")
    raise_collected(problems)
    out = {key: value for key, value in data.items()
           if key not in ("architectures", "model_type", "rope_parameters", "dflash_config")}
    out.update({"architectures": [ARCHITECTURE], "model_type": "qwen3"})
    nested = data.get("dflash_config")
    if nested is not None:
        out["dflash_config"] = nested  # disagreeing copies are refused by the reader
    params = data.get("rope_parameters")
    if isinstance(params, dict):
        # Top-level spellings, as we write them (docs/format.md §5); the reader checks rope_type.
        out.setdefault("rope_theta", params.get("rope_theta"))
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
        out.setdefault("rope_scaling", None if rest in ({}, {"rope_type": "default"}) else rest)
    elif params is not None:
        out["rope_parameters"] = params  # not an object: the reader names it
    types = data.get("layer_types")
    if isinstance(types, list) and "sliding_attention" in types:
        # transformers' sliding layers are bidirectional inside the window: say so, so no reader assumes causal.
        out.update({"use_sliding_window": True, "is_causal": False})
    return out


def to_transformers_tensors(state_dict: dict) -> dict:
    """Our §2 tensor names -> transformers' names (same tensors)."""
    return {HF_TENSOR_NAMES.get(name, name): tensor for name, tensor in state_dict.items()}


def native_tensor_name(name: str) -> str:
    """A transformers-form tensor name -> ours (docs/format.md §2)."""
    return NATIVE_TENSOR_NAMES.get(name, name)
