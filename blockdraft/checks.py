"""Checks that refuse a draft before it can silently decode badly (docs/format.md §6).

Three groups: a draft config against its target (layer count, width, vocabulary, mask token, RoPE,
fingerprints), the choice of a mask token for a new draft (docs/training.md §1), and the tensor names, dtypes and
shapes of a checkpoint as read from its safetensors headers. Problems are collected and raised once.
This module needs neither torch nor the draft config class, so `blockdraft.config` can build on it.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Any

from .errors import BlockdraftError, ConfigError

MASK_TOKEN = "<|MASK|>"
MASK_FIELD = "`dflash_config.mask_token_id`"
IDS_FIELD = "`dflash_config.target_layer_ids`"
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
# The target's own embedding and head; a draft file may carry a copy, but the target's are always used.
IGNORED_PREFIXES = ("embed_tokens.", "lm_head.")


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def raise_collected(problems: list[str], error: type[BlockdraftError] = ConfigError) -> None:
    """Raise one error listing every problem, or return if there are none (docs/format.md §6: collect, raise once)."""
    if not problems:
        return
    if len(problems) == 1:
        raise error(problems[0])
    raise error(f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))


def export_layer_problems(cfg, runtime: str) -> list[str]:
    """What an exported draft's layers need that `runtime` (transformers' DFlash class, llama.cpp's DFlash loader)
    lacks: both build q/k/v/o without biases (the bias tensors would be dropped without a word), and both run a
    sliding layer bidirectionally inside its window where ours is causal (docs/format.md §3.5)."""
    problems = []
    if cfg.attention_bias:
        problems.append(f"`attention_bias` is true, but {runtime} has no q/k/v/o biases; export a draft trained "
                        "without attention bias")
    if any(t != "full_attention" for t in cfg.layer_types):
        problems.append(f"`layer_types` is {list(cfg.layer_types)}; only full-attention drafts export, since "
                        f"{runtime} runs sliding layers non-causally; export a full-attention draft")
    return problems


def normalise_rope_scaling(scaling):
    """`rope_scaling`/`rope_parameters` minus `rope_theta`; None when it only says rope_type 'default'."""
    if not isinstance(scaling, dict):
        return scaling
    rest = {k: v for k, v in scaling.items() if k != "rope_theta"}
    if not rest or rest in ({"rope_type": "default"}, {"type": "default"}):
        return None
    return rest


# ---------------------------------------------------------------------------------------------------------
# The target's side


def text_config(target_config):
    """The text part of a (possibly multimodal) transformers config."""
    get = getattr(target_config, "get_text_config", None)
    return get() if callable(get) else target_config


def target_shape(target_config) -> dict[str, Any]:
    """The target fields a draft copies: N, D, h, g, d, I, vocab, eps, RoPE and max positions."""
    cfg = text_config(target_config)
    missing = [name for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                                 "vocab_size", "rms_norm_eps", "max_position_embeddings")
               if getattr(cfg, name, None) is None]
    if missing:
        raise ConfigError(f"the target config lacks {missing}; pass the full config of a Llama- or Qwen3-family target")
    heads = cfg.num_attention_heads
    theta, scaling = _target_rope(cfg)
    return {
        "num_hidden_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size, "num_attention_heads": heads,
        "num_key_value_heads": getattr(cfg, "num_key_value_heads", None) or heads,
        # Llama configs may omit head_dim; then it is D / h, as transformers computes it.
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": float(cfg.rms_norm_eps), "rope_theta": theta, "rope_scaling": scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
    }


def _target_rope(cfg) -> tuple[float, dict | None]:
    # transformers 5 keeps the base in `rope_parameters`; 4.x in `rope_theta` beside `rope_scaling`.
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"]), normalise_rope_scaling(params)
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        raise ConfigError("the target config has no RoPE base (`rope_parameters['rope_theta']` or `rope_theta`); "
                          "pass the target's full config")
    return float(theta), normalise_rope_scaling(getattr(cfg, "rope_scaling", None))


def _sha256_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def target_arch_sha256(target_config) -> str:
    """SHA-256 of the sorted-key compact JSON of the target's N, D, h, g, d, I, vocab, RoPE and eps (docs/format.md §5)."""
    shape = target_shape(target_config)
    del shape["max_position_embeddings"]  # not part of the fingerprint: positions do not change the features
    return _sha256_json(shape)


def tokenizer_sha256(tokenizer) -> str:
    """SHA-256 of the sorted-key compact JSON of the tokenizer's token -> id map (docs/format.md §5)."""
    vocab = _vocab(tokenizer)
    if not vocab:
        raise ConfigError(f"cannot fingerprint tokenizer {type(tokenizer).__name__}: it has no get_vocab(); "
                          "pass a transformers tokenizer")
    return _sha256_json(vocab)


def provenance_for(target_config, tokenizer=None, *, target: str | None = None,
                   target_revision: str | None = None) -> dict[str, Any]:
    """The `blockdraft` block a trainer stores with a draft, so loaders can spot a different target."""
    from importlib.metadata import PackageNotFoundError, version

    provenance: dict[str, Any] = {"format": 1}
    try:
        provenance["version"] = version("blockdraft")
    except PackageNotFoundError:
        pass  # running from a source tree: there is no release number to record
    if target is not None:
        provenance["target"] = target
    if target_revision is not None:
        provenance["target_revision"] = target_revision
    provenance["target_arch_sha256"] = target_arch_sha256(target_config)
    if tokenizer is not None:
        provenance["tokenizer_sha256"] = tokenizer_sha256(tokenizer)
    return provenance


# ---------------------------------------------------------------------------------------------------------
# A draft config against its target (docs/format.md §6 "against the target")


def check_against_target(cfg, target_config, tokenizer=None, *, allow_last_layer: bool = False,
                         strict: bool = False) -> list[str]:
    """Refuse a draft that does not fit `target_config` (raises ConfigError listing every failure).

    Returns warnings for the caller to show: shorter draft positions, and fingerprint mismatches
    (which `strict=True` turns into errors). `allow_last_layer` accepts id N-1 (docs/format.md §3.1).
    """
    target = target_shape(target_config)
    problems = _layer_problems(cfg, target["num_hidden_layers"], allow_last_layer)
    for name in ("hidden_size", "vocab_size"):
        if getattr(cfg, name) != target[name]:
            problems.append(f"`{name}` is {getattr(cfg, name)} but the target's is {target[name]}; the draft was "
                            "built for another target; use the draft trained for this target")
    problems += mask_problems(cfg.mask_token_id, target["vocab_size"], target_config, tokenizer)
    # MO: a different RoPE base "breaks serving"; the draft's positions must rotate like the target's.
    if (cfg.rope_theta, cfg.rope_scaling) != (target["rope_theta"], target["rope_scaling"]):
        problems.append(f"`rope_theta`/`rope_scaling` are {cfg.rope_theta}/{cfg.rope_scaling} but the target's are "
                        f"{target['rope_theta']}/{target['rope_scaling']}; set them to the target's values, "
                        "as the draft was trained with")
    found: list[str] = []
    if cfg.max_position_embeddings < target["max_position_embeddings"]:
        found.append(f"`max_position_embeddings` is {cfg.max_position_embeddings}, below the target's "
                     f"{target['max_position_embeddings']}; the draft was not trained at longer contexts")
    mismatches = _fingerprint_mismatches(cfg.provenance or {}, target_config, tokenizer)
    (problems if strict else found).extend(mismatches)
    raise_collected(problems)
    return found


def _layer_problems(cfg, N: int, allow_last_layer: bool) -> list[str]:
    problems = []
    if cfg.num_target_layers != N:
        problems.append(f"`num_target_layers` is {cfg.num_target_layers} but the target has {N} layers; the "
                        "draft was trained for another target; use the draft trained for this target")
    ids = list(cfg.target_layer_ids)
    outside = [i for i in ids if i >= N]
    if outside:
        # Out-of-range ids would be silently remapped or crash inside an engine (zl#156, sglang#37475).
        problems.append(f"{IDS_FIELD} {ids} has ids {outside} out of range for a {N}-layer target (valid "
                        f"0..{N - 1}); use the draft trained for this target")
    elif N - 1 in ids and not allow_last_layer:
        problems.append(f"{IDS_FIELD} {ids} includes {N - 1}, the target's last layer, which HF returns post-norm "
                        "and engines pre-norm (not portable); pass allow_last_layer=True if the draft was "
                        "trained on HF hidden states")
    return problems


def _fingerprint_mismatches(provenance: dict, target_config, tokenizer) -> list[str]:
    checks = [("target_arch_sha256", lambda: target_arch_sha256(target_config), "shape, RoPE or eps")]
    if tokenizer is not None:
        checks.append(("tokenizer_sha256", lambda: tokenizer_sha256(tokenizer), "token-to-id map"))
    found = []
    for key, compute, what in checks:
        recorded = provenance.get(key)
        if recorded is None:
            continue
        actual = compute()
        if recorded != actual:
            found.append(f"`blockdraft.{key}` is {str(recorded)[:16]}... but this target's is {actual[:16]}...: "
                         f"the draft was trained on a target with a different {what} (recorded target "
                         f"{provenance.get('target')!r}); use that target or retrain the draft for this one")
    return found


# ---------------------------------------------------------------------------------------------------------
# The mask token (docs/training.md §1)


def mask_problems(mask: int, rows: int, target_config, tokenizer=None) -> list[str]:
    """Why `mask` cannot be the mask id of a draft over a target with `rows` embedding rows (empty if it can)."""
    if not (is_int(mask) and 0 <= mask < rows):
        return [(f"{MASK_FIELD} is {mask!r} but the target embedding has {rows} rows; the mask must be one of "
                 "them; use the mask id the draft was trained with")]
    problems = []
    roles = reserved_ids(target_config, tokenizer)
    # The block would then feed a token the target really emits; drafts stop at it or repeat it.
    if mask in roles:
        problems.append(f"{MASK_FIELD} is {mask}, the target's {roles[mask]} token; the mask must never be a real "
                        "token; choose an unused special token (choose_mask_token_id) and retrain")
    if tokenizer is None:
        return problems
    token = _added_specials(tokenizer).get(mask)
    if token is not None and token in template_text(tokenizer):
        problems.append(f"{MASK_FIELD} is {mask} ({token!r}), a token the chat template writes; the mask must "
                        "never occur in prompts; choose an unused special token and retrain")
    tokenizer_mask = _vocab(tokenizer).get(MASK_TOKEN)
    if tokenizer_mask is not None and tokenizer_mask != mask:
        problems.append(f"{MASK_FIELD} is {mask} but the tokenizer's {MASK_TOKEN} is {tokenizer_mask}; use the "
                        "tokenizer the draft was trained with, or set the mask id to its mask token")
    return problems


def choose_mask_token_id(tokenizer, target_config, user_value: int | None = None) -> int:
    """The mask id for a new draft, in docs/training.md §1's order; raises ConfigError if none is safe.

    1. `user_value`; 2. `tokenizer.mask_token_id`; 3. the tokenizer's `<|MASK|>`, or the first embedding row
    past the tokenizer (where an added `<|MASK|>` lands; Qwen3: 151669); 4. a reserved unused special.
    """
    rows = target_shape(target_config)["vocab_size"]
    candidates = [("the value passed", user_value)]
    if tokenizer is not None:
        vocab = _vocab(tokenizer)
        spare = max(vocab.values(), default=rows) + 1
        candidates += [("tokenizer.mask_token_id", getattr(tokenizer, "mask_token_id", None)),
                       (f"the tokenizer's {MASK_TOKEN}", vocab.get(MASK_TOKEN)),
                       ("the first spare embedding row", spare if spare < rows else None)]
        unused = unused_specials(tokenizer, target_config, rows)
        candidates.append(("the last unused special token", unused[-1] if unused else None))
    for source, candidate in candidates:
        if candidate is not None:
            problems = mask_problems(candidate, rows, target_config, tokenizer)
            raise_collected([f"{p} (mask id from {source})" for p in problems])
            return candidate
    raise ConfigError("no safe mask token id for this target: no mask token, no spare embedding row and no "
                      "unused special token (or no tokenizer given); pass mask_token_id explicitly, an id the "
                      "target never emits")


def unused_specials(tokenizer, target_config, rows: int) -> list[int]:
    """Specials in the first contiguous run of added tokens that are neither bos/eos/pad/unk nor in the template.

    Tokenizers put their reserved specials in one run; its first entries are the control tokens, so the
    caller takes the last unused one, furthest from them. SmolLM2: run 0..16, 3..16 unused -> 16
    `<empty_output>`, the value docs/training.md fixes.
    """
    specials = _added_specials(tokenizer)
    run: list[int] = []
    for i in sorted(specials):
        if run and i != run[-1] + 1:
            break
        run.append(i)
    roles, template = reserved_ids(target_config, tokenizer), template_text(tokenizer)
    return [i for i in run if i < rows and i not in roles and specials[i] not in template]


def reserved_ids(target_config, tokenizer=None) -> dict[int, str]:
    """bos/eos/pad/unk ids from the tokenizer and the target config -> their roles ("eos/pad")."""
    roles: dict[int, list[str]] = {}
    for source in (tokenizer, text_config(target_config), target_config):
        for role in ("bos", "eos", "pad", "unk"):
            value = getattr(source, f"{role}_token_id", None) if source is not None else None
            for i in value if isinstance(value, (list, tuple)) else [value]:
                if is_int(i) and role not in roles.setdefault(i, []):
                    roles[i].append(role)
    return {i: "/".join(names) for i, names in roles.items()}


def template_text(tokenizer) -> str:
    """All chat template source text of a tokenizer (templates may be one string or a dict by name)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template if isinstance(template, str) else ""


def _added_specials(tokenizer) -> dict[int, str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {int(i): str(getattr(t, "content", t)) for i, t in decoder.items() if getattr(t, "special", True)}


def _vocab(tokenizer) -> dict[str, int]:
    get = getattr(tokenizer, "get_vocab", None)
    return dict(get()) if callable(get) else {}


# ---------------------------------------------------------------------------------------------------------
# Checkpoint tensors (docs/format.md §2, §6 item 10)


def canonical_tensor_names(stored: list[str]) -> tuple[dict[str, str], list[str]]:
    """Map docs/format.md §2 names to stored names; returns (mapping, problems).

    A leading `model.` (vLLM-style export) is stripped with a warning; the target's `embed_tokens` and
    `lm_head` are dropped with a warning, since the target's own are always used.
    """
    names: dict[str, str] = {}
    problems, prefixed, ignored = [], [], []
    for name in stored:
        canonical = name.removeprefix("model.")
        if canonical != name:
            prefixed.append(name)
        if canonical.startswith(IGNORED_PREFIXES):
            ignored.append(name)
        elif canonical in names:
            problems.append(f"tensor `{canonical}` is stored twice (`{names[canonical]}` and `{name}`); keep one "
                            "copy, without the `model.` prefix")
        else:
            names[canonical] = name
    if prefixed:
        warnings.warn(f"{len(prefixed)} tensor names carry a leading `model.` prefix (e.g. `{prefixed[0]}`); "
                      "stripped it; docs/format.md §2 names have none", stacklevel=3)
    if ignored:
        warnings.warn(f"ignoring {ignored}: the draft uses the target's own embedding and lm_head", stacklevel=3)
    return names, problems


def tensor_problems(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[str, tuple[int, ...]]]) -> list[str]:
    """Compare found {name: (safetensors dtype, shape)} with the expected {name: shape} of the config."""
    problems = []
    unknown = sorted(set(found) - set(expected))
    missing = [name for name in expected if name not in found]
    if unknown:
        problems.append(f"unexpected tensors {_some(unknown)}: not part of a DFlash v1 draft with this config.json "
                        "(docs/format.md §2); a different variant or a bad conversion; use a DFlash v1 checkpoint")
    if missing:
        problems.append(f"missing tensors {_some(missing)}; the weights do not match config.json (`num_hidden_layers`, "
                        "`attention_bias`); use the config.json that belongs to these weights")
    for name, shape in expected.items():
        if name not in found:
            continue
        dtype, got = found[name]
        if tuple(got) != tuple(shape):
            problems.append(f"tensor `{name}` has shape {list(got)} but config.json implies {list(shape)}; "
                            "use the config.json that belongs to these weights")
        if dtype not in FLOAT_DTYPES:
            problems.append(f"tensor `{name}` has dtype {dtype}; draft weights must be one of {list(FLOAT_DTYPES)}; "
                            "re-export the draft in bf16 or fp32")
    return problems


def _some(names: list[str], limit: int = 8) -> str:
    """A name list short enough to read: a whole foreign checkpoint can have hundreds of keys."""
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return f"{names[:limit]}{more}"
