"""Reading a draft's config.json: both published layouts into flat fields, and every field check.

`DraftConfig.from_dict` (blockdraft.config) runs these in order: `variant_problems` refuses DFlash variants
that compute something else, `read_fields` collects the values from the flat or the nested
(`dflash_config`) layout, `config_problems` checks them. Every problem names the field, the value found and
the fix (docs/format.md §6); they are collected and raised once by the caller.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from .checks import is_int, is_number, normalise_rope_scaling

ARCHITECTURE = "DFlashDraftModel"
LAYER_TYPES = ("full_attention", "sliding_attention")
# Loss decay per block size (docs/training.md §1); other sizes have no published value.
# Fields that live in `dflash_config` (or, in older files, at the top level); never guessed when missing.
DFLASH_FIELDS = ("block_size", "target_layer_ids", "mask_token_id", "num_target_layers")
# Newer z-lab extras (docs/format.md §3.8): applied when present; blockdraft never sets them itself.
EXTRA_FIELDS = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")
POSITIVE_INT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                       "head_dim", "intermediate_size", "max_position_embeddings", "vocab_size")
# Top-level shape fields a published draft always carries; a missing one would fall back to a Qwen3 default
# that belongs to some other model (docs/format.md §4), so it is refused instead.
REQUIRED_FLAT_FIELDS = POSITIVE_INT_FIELDS + ("rms_norm_eps",)


def variant_problems(data: dict) -> list[str]:
    """docs/format.md §6 items 1-2: only DFlash v1 Qwen3-style drafts; other variants compute something else."""
    problems = []
    archs = data.get("architectures")
    if isinstance(archs, list) and "DFlash2DraftModel" in archs:
        problems.append(f"`architectures` is {archs}: DFlash2 drafts are not supported; use a DFlash v1 "
                        f"({ARCHITECTURE}) checkpoint")
    elif not (isinstance(archs, list) and ARCHITECTURE in archs):
        problems.append(f"`architectures` must contain {ARCHITECTURE!r}, got {archs!r}; "
                        "this is not a DFlash v1 draft checkpoint")
    nested = data.get("dflash_config") if isinstance(data.get("dflash_config"), dict) else {}
    for key in sorted(set(data) | set(nested)):
        if key in ("projector_type", "shift_label") or key.startswith(("conv_", "selector_", "markov_")):
            problems.append(f"`{key}` belongs to a DFlash variant blockdraft does not support; "
                            "use a DFlash v1 checkpoint without it")
    checks = [("model_type", data.get("model_type"), "qwen3"), ("hidden_act", data.get("hidden_act", "silu"), "silu")]
    problems += [f"`{name}` must be {want!r}, got {got!r}; DFlash v1 drafts are Qwen3-style with SwiGLU (silu)"
                 for name, got, want in checks if got != want]
    # Non-causal full attention is the format's semantics (docs/format.md §3.5); a causal override is another model.
    if True in (data.get("is_causal"), nested.get("is_causal")):
        problems.append("`is_causal` is true; blockdraft runs DFlash draft attention non-causally; "
                        "use a draft trained with non-causal full attention")
    for name, other in (("target_hidden_size", "hidden_size"), ("draft_vocab_size", "vocab_size")):
        if data.get(name) is not None and data.get(name) != data.get(other):
            problems.append(f"`{name}` is {data[name]!r} but `{other}` is {data.get(other)!r}; blockdraft needs "
                            f"them equal (no projection or reduced vocabulary); use a draft where they match")
    return problems


def read_fields(data: dict) -> tuple[dict[str, Any], list[str]]:
    """Collect DraftConfig's fields from either layout; returns (values present, problems)."""
    problems: list[str] = []
    nested = data.get("dflash_config")
    nested = {} if nested is None else nested
    if not isinstance(nested, dict):
        problems.append(f"`dflash_config` must be an object, got {nested!r}; write it as a JSON object")
        nested = {}
    values: dict[str, Any] = {}
    for name in DFLASH_FIELDS:
        _read_copies(data, nested, name, values, problems)
    for name in REQUIRED_FLAT_FIELDS:
        if data.get(name) is None:
            problems.append(f"`{name}` is required, got none; set it in config.json (the target's value)")
        else:
            values[name] = data[name]
    values["attention_bias"] = data.get("attention_bias", False)
    for name in EXTRA_FIELDS:
        values[name] = nested.get(name, data.get(name))
    values["provenance"] = data.get("blockdraft")
    values.update(_read_rope(data, problems))
    values.update(_read_layer_types(data, problems))
    if isinstance(values.get("target_layer_ids"), list):
        values["target_layer_ids"] = tuple(values["target_layer_ids"])
    return values, problems


def _read_copies(data: dict, nested: dict, name: str, values: dict, problems: list[str]) -> None:
    # `dflash_config` wins over the top level, but two copies that disagree mean the file was hand-edited
    # or converted badly: which one the draft was trained with is unknown, so neither is trusted.
    top, inner = data.get(name), nested.get(name)
    spelling = {"block_size": "`block_size` (top level and `dflash_config.block_size`)",
                "num_target_layers": "`num_target_layers`"}.get(name, f"`dflash_config.{name}`")
    if top is None and inner is None:
        fix = {"block_size": "the block size", "target_layer_ids": "the ids", "mask_token_id": "the mask token id",
               "num_target_layers": "the target's layer count"}[name]
        problems.append(f"{spelling} is required, got none; add {fix} the draft was trained with")
    elif top is not None and inner is not None and top != inner:
        problems.append(f"`dflash_config.{name}` is {inner!r} but top-level `{name}` is {top!r}; the copies "
                        "must agree; set both to the value the draft was trained with")
    else:
        values[name] = inner if inner is not None else top


def _read_rope(data: dict, problems: list[str]) -> dict[str, Any]:
    # Readers disagree on the default base (10000 in transformers 4.57, 1e6 in vLLM), so it must be explicit;
    # a file carrying both spellings must not mean two different rotations.
    params = data.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        problems.append(f"`rope_parameters` must be an object, got {params!r}; use top-level `rope_theta`")
        params = None
    flat_theta, nested_theta = data.get("rope_theta"), (params or {}).get("rope_theta")
    flat_scaling = normalise_rope_scaling(data.get("rope_scaling"))
    nested_scaling = normalise_rope_scaling(params) if params is not None else None
    if flat_theta is None and nested_theta is None:
        problems.append("`rope_theta` is required, got none (neither top level nor `rope_parameters.rope_theta`); "
                        "set it to the target's RoPE base")
        return {"rope_scaling": flat_scaling if "rope_scaling" in data else nested_scaling}
    if flat_theta is not None and nested_theta is not None and flat_theta != nested_theta:
        problems.append(f"`rope_theta` is {flat_theta!r} but `rope_parameters.rope_theta` is {nested_theta!r}; "
                        "the two spellings must agree; keep only top-level `rope_theta`")
    if params is not None and "rope_scaling" in data and flat_scaling != nested_scaling:
        problems.append(f"`rope_scaling` is {data['rope_scaling']!r} but `rope_parameters` says {params!r}; the "
                        "two spellings must agree; keep only top-level `rope_theta`/`rope_scaling`")
    theta = flat_theta if flat_theta is not None else nested_theta
    # Integers in JSON (1000000) and floats (1e6) are the same base; store one form so configs compare equal.
    theta = float(theta) if is_number(theta) else theta
    return {"rope_theta": theta, "rope_scaling": flat_scaling if "rope_scaling" in data else nested_scaling}


def _read_layer_types(data: dict, problems: list[str]) -> dict[str, Any]:
    use = data.get("use_sliding_window", False)
    types = data.get("layer_types")
    count = data.get("num_hidden_layers")
    if types is None:
        if not is_int(count):
            return {}  # the missing/invalid layer count is reported on its own
        # Derived as transformers' Qwen3Config does: sliding from `max_window_layers` on, when enabled.
        start = data.get("max_window_layers", 28)
        if use and not is_int(start):
            problems.append(f"`max_window_layers` must be an integer, got {start!r}; fix config.json")
            return {}
        types = ["sliding_attention" if use and i >= start else "full_attention" for i in range(count)]
    sliding = isinstance(types, (list, tuple)) and "sliding_attention" in types
    if sliding and use is not True:
        problems.append(f"`layer_types` has sliding_attention layers but `use_sliding_window` is {use!r}; HF "
                        "readers then drop the window; set `use_sliding_window` to true")
    # HF nulls the window unless sliding is in use; storing a dead window would break config equality.
    window = data.get("sliding_window") if sliding else None
    return {"layer_types": tuple(types) if isinstance(types, list) else types, "sliding_window": window}


# ---------------------------------------------------------------------------------------------------------
# Checking values (docs/format.md §6 "checkpoint alone" items 3-9)


def config_problems(v: dict[str, Any]) -> list[str]:
    """Problems with the field values present in `v`; absent fields are reported by the reader."""
    problems = [f"`{name}` must be a positive integer, got {v[name]!r}; set it to the draft's {name}"
                for name in POSITIVE_INT_FIELDS if name in v and not (is_int(v[name]) and v[name] > 0)]
    h, g = v.get("num_attention_heads"), v.get("num_key_value_heads")
    if is_int(h) and is_int(g) and h > 0 and g > 0 and h % g:
        problems.append(f"`num_attention_heads` ({h}) must be a multiple of `num_key_value_heads` ({g}); "
                        "copy both from the target")
    for name in ("rms_norm_eps", "rope_theta"):
        if name in v and not (is_number(v[name]) and v[name] > 0):
            problems.append(f"`{name}` must be a positive number, got {v[name]!r}; copy it from the target")
    if "attention_bias" in v and not isinstance(v["attention_bias"], bool):
        problems.append(f"`attention_bias` must be true or false, got {v['attention_bias']!r}; fix config.json")
    problems += _layer_id_problems(v) + _block_and_mask_problems(v) + _layer_type_problems(v) + _rope_problems(v)
    for name in EXTRA_FIELDS:
        if v.get(name) is not None and not is_number(v[name]):
            problems.append(f"`dflash_config.{name}` must be a number, got {v[name]!r}; fix or remove it")
    if v.get("provenance") is not None and not isinstance(v["provenance"], dict):
        problems.append(f"`blockdraft` must be an object, got {v['provenance']!r}; fix or remove it")
    return problems


def _layer_id_problems(v: dict[str, Any]) -> list[str]:
    # Wrong ids raise nothing at run time: they only collapse acceptance (zl#156, zl#157, sglang#37475).
    problems = []
    field, ids, N = "`dflash_config.target_layer_ids`", v.get("target_layer_ids"), v.get("num_target_layers")
    ids_ok = False
    if "target_layer_ids" in v:
        bad = [i for i in ids if not is_int(i) or i < 0] if isinstance(ids, (list, tuple)) else None
        if not isinstance(ids, (list, tuple)) or not ids:
            problems.append(f"{field} must be a non-empty list of target layer indices, got {ids!r}; "
                            "set it to the ids the draft was trained with")
        elif bad:
            problems.append(f"{field} must hold integers >= 0 (not booleans), got {list(ids)} (bad: {bad}); "
                            "set it to the integer ids the draft was trained with")
        elif any(b <= a for a, b in pairwise(ids)):
            # fc columns follow list order and TRT-LLM sorts the ids: an unsorted list is not portable.
            problems.append(f"{field} must be strictly increasing, got {list(ids)}; blockdraft loads only drafts "
                            "trained with increasing, distinct ids (docs/format.md §3.2); retrain with sorted ids")
        else:
            ids_ok = True
    if "num_target_layers" in v:
        if not (is_int(N) and N > 0):
            problems.append(f"`num_target_layers` must be a positive integer, got {N!r}; "
                            "set it to the target's number of decoder layers")
        elif ids_ok and max(ids) >= N:
            problems.append(f"{field} has id {max(ids)} but `num_target_layers` is {N}; ids must be < "
                            "num_target_layers; set num_target_layers to the target's layer count")
    return problems


def _block_and_mask_problems(v: dict[str, Any]) -> list[str]:
    problems = []
    K = v.get("block_size")
    if "block_size" in v and not (is_int(K) and K >= 2):
        problems.append(f"`block_size` must be an integer >= 2 (the anchor plus at least one draft slot), got "
                        f"{K!r}; set `block_size` and `dflash_config.block_size` to the trained block size")
    mask, vocab = v.get("mask_token_id"), v.get("vocab_size")
    if "mask_token_id" in v:
        if not (is_int(mask) and mask >= 0):
            problems.append(f"`dflash_config.mask_token_id` must be an integer >= 0, got {mask!r}; "
                            "set it to the mask token id the draft was trained with")
        elif is_int(vocab) and mask >= vocab:
            problems.append(f"`dflash_config.mask_token_id` is {mask} but `vocab_size` is {vocab}; the mask must "
                            "be a row of the target embedding; set it to the id the draft was trained with")
    return problems


def _layer_type_problems(v: dict[str, Any]) -> list[str]:
    if "layer_types" not in v:
        return []
    types, count, K, window = v["layer_types"], v.get("num_hidden_layers"), v.get("block_size"), v.get("sliding_window")
    if not isinstance(types, (list, tuple)):
        return [f"`layer_types` must be a list, got {types!r}; give one entry per draft layer"]
    problems = []
    if is_int(count) and len(types) != count:
        problems.append(f"`layer_types` has {len(types)} entries but `num_hidden_layers` is {count}; "
                        "give one entry per draft layer")
    unknown = sorted({str(t) for t in types if t not in LAYER_TYPES})
    if unknown:
        problems.append(f"`layer_types` contains {unknown}; each entry must be one of {list(LAYER_TYPES)}")
    # A window shorter than the block would hide part of the block from itself.
    if "sliding_attention" in types and not (is_int(window) and is_int(K) and window >= K):
        problems.append(f"`sliding_window` must be an integer >= `block_size` ({K!r}) when a layer is "
                        f"sliding_attention, got {window!r}; set it to the window the draft was trained with")
    elif window is not None and not (is_int(window) and window > 0):
        problems.append(f"`sliding_window` must be a positive integer or null, got {window!r}; fix config.json")
    return problems


def _rope_problems(v: dict[str, Any]) -> list[str]:
    scaling = v.get("rope_scaling")
    if scaling is None:
        return []
    if not isinstance(scaling, dict):
        return [f"`rope_scaling` must be an object or null, got {scaling!r}; fix config.json"]
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "default":
        return [(f"`rope_scaling` has rope_type {kind!r}; blockdraft implements only the default RoPE; "
                 "use a draft (and target) with rope_type 'default' or null `rope_scaling`")]
    return []
