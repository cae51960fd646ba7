"""The draft configuration: a frozen, validated `DraftConfig`, the default layer-id rule and the loss decay.

`DraftConfig.from_dict` reads both published `config.json` layouts and `to_dict` writes the one blockdraft
publishes (docs/format.md §4-5). Every check fails closed (docs/format.md §6): all problems are collected and raised
as one `ConfigError` whose lines name the field, the value found and the fix. Checks against a target
(layer count, width, vocabulary, mask token, RoPE, fingerprints) live in `blockdraft.checks` and are
re-exported here; reading config.json's two layouts and the per-field checks live in
`blockdraft.config_fields`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from fractions import Fraction
from itertools import pairwise
from typing import Any

from .errors import ConfigError
from .config_fields import (
    ARCHITECTURE,
    EXTRA_FIELDS,
    config_problems,
    read_fields,
    variant_problems,
)
from .checks import (
    check_against_target,
    choose_mask_token_id,
    is_int,
    provenance_for,
    raise_collected,
    target_arch_sha256,
    target_shape,
    tokenizer_sha256,
)

# Loss decay per block size (docs/training.md §1); other sizes have no published value.
GAMMA_BY_BLOCK_SIZE = {16: 7.0, 10: 5.0, 8: 4.0}

def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """docs/training.md §1: `[N // 2]` for one id, else n ids spread evenly over 1..N-3 (half-to-even rounding).

    N=30, n=5 -> (1, 8, 14, 20, 27): 7.5 rounds to 8 and 20.5 to 20, as Python's `round` does.
    """
    N, n = num_target_layers, num_draft_layers
    if not (is_int(N) and is_int(n) and N > 0 and n > 0):
        raise ConfigError(f"target layers and draft layers must be positive integers, got N={N!r}, n={n!r}; "
                          "pass the target's layer count and the number of draft layers")
    if n == 1:
        return (N // 2,)
    # Fraction keeps the halves exact, so rounding matches the reference's round() on every N and n.
    ids = tuple(round(1 + Fraction(i * (N - 4), n - 1)) for i in range(n))
    if N < 4 or any(b <= a for a, b in pairwise(ids)):
        raise ConfigError(f"cannot spread {n} target layer ids over 1..N-3 of a {N}-layer target (got {list(ids)}); "
                          "pass `target_layer_ids` explicitly or use fewer ids")
    return ids


def gamma_for_block_size(block_size: int) -> float:
    """The loss decay gamma for block size K (docs/training.md §1): 16 -> 7, 10 -> 5, 8 -> 4."""
    if block_size not in GAMMA_BY_BLOCK_SIZE or isinstance(block_size, bool):
        raise ConfigError(f"no published loss decay gamma for `block_size` {block_size!r} (known: 16, 10, 8); "
                          "pass gamma explicitly (--gamma)")
    return GAMMA_BY_BLOCK_SIZE[block_size]


@dataclass(frozen=True)
class DraftConfig:
    """A DFlash v1 draft's shape and the target interface it was trained for (docs/format.md §4).

    Lists are stored as tuples; `provenance` is the top-level `blockdraft` dict of the checkpoint.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    vocab_size: int
    attention_bias: bool
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    layer_types: tuple[str, ...]
    sliding_window: int | None
    input_embedding_scale: float | None = None
    output_multiplier: float | None = None
    final_logit_softcapping: float | None = None
    provenance: dict | None = None

    def __post_init__(self) -> None:
        # JSON and callers hand in lists; tuples keep the config immutable and comparable.
        for name in ("target_layer_ids", "layer_types"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        raise_collected(config_problems({f.name: getattr(self, f.name) for f in fields(self)}))

    @classmethod
    def from_dict(cls, data: dict) -> DraftConfig:
        """Read a parsed `config.json`, flat or nested layout (docs/format.md §4, §6 items 1-9)."""
        if not isinstance(data, dict):
            raise ConfigError(f"a draft config must be a JSON object, got {type(data).__name__}; "
                              "pass the parsed config.json")
        problems = variant_problems(data)
        values, read = read_fields(data)
        problems += read
        problems += config_problems(values)
        raise_collected(problems)
        return cls(**values)

    def to_dict(self, dtype: str = "bfloat16") -> dict[str, Any]:
        """The layout blockdraft writes (docs/format.md §5): flat, `block_size` copied into `dflash_config`."""
        nested: dict[str, Any] = {"block_size": self.block_size, "mask_token_id": self.mask_token_id,
                                  "target_layer_ids": list(self.target_layer_ids)}
        # Extras are only ever present when read from a file that had them; dropping them on re-save would
        # silently change the draft's outputs.
        nested.update({name: getattr(self, name) for name in EXTRA_FIELDS if getattr(self, name) is not None})
        out = {
            "architectures": [ARCHITECTURE],
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "model_type": "qwen3",
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": nested,
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size, "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps, "attention_bias": self.attention_bias,
            "vocab_size": self.vocab_size, "max_position_embeddings": self.max_position_embeddings,
            # Top-level RoPE only: transformers 4.57 ignores `rope_parameters` and would run theta 10000.
            "rope_theta": self.rope_theta, "rope_scaling": copy.deepcopy(self.rope_scaling),
            "layer_types": list(self.layer_types),
            "use_sliding_window": "sliding_attention" in self.layer_types, "sliding_window": self.sliding_window,
            "tie_word_embeddings": False, "dtype": dtype,
        }
        if self.provenance is not None:
            out["blockdraft"] = copy.deepcopy(self.provenance)
        return out

    @classmethod
    def for_target(cls, target_config, num_draft_layers: int, block_size: int = 16, *, mask_token_id: int,
                   target_layer_ids=None, max_position_embeddings: int | None = None) -> DraftConfig:
        """A fresh draft shaped like the target (docs/training.md §1): width, heads, MLP, eps, RoPE, positions, vocab."""
        shape = target_shape(target_config)
        N = shape["num_hidden_layers"]
        ids = default_target_layer_ids(N, num_draft_layers) if target_layer_ids is None else tuple(target_layer_ids)
        return cls(
            hidden_size=shape["hidden_size"], num_hidden_layers=num_draft_layers,
            num_attention_heads=shape["num_attention_heads"], num_key_value_heads=shape["num_key_value_heads"],
            head_dim=shape["head_dim"], intermediate_size=shape["intermediate_size"],
            rms_norm_eps=shape["rms_norm_eps"], rope_theta=shape["rope_theta"], rope_scaling=shape["rope_scaling"],
            max_position_embeddings=max_position_embeddings or shape["max_position_embeddings"],
            vocab_size=shape["vocab_size"], attention_bias=False, block_size=block_size, num_target_layers=N,
            target_layer_ids=ids, mask_token_id=mask_token_id,
            layer_types=("full_attention",) * num_draft_layers if is_int(num_draft_layers) else (),
            sliding_window=None,
        )


__all__ = [
    "DraftConfig", "check_against_target", "choose_mask_token_id", "default_target_layer_ids",
    "gamma_for_block_size", "provenance_for", "target_arch_sha256", "tokenizer_sha256",
]
