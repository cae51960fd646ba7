"""Draft checkpoint folders: round trips (single file and shards) and every refusal of docs/format.md §6 item 10."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from blockdraft.config import DraftConfig
from blockdraft.errors import CheckpointError, ConfigError
from blockdraft.io.checkpoint import (
    expected_tensor_shapes,
    read_checkpoint,
    read_config,
    write_checkpoint,
)

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
        "max_position_embeddings": 512, "vocab_size": 128, "attention_bias": False, "block_size": 16,
        "num_target_layers": 6, "target_layer_ids": (1, 3), "mask_token_id": 100,
        "layer_types": ("full_attention",) * 2, "sliding_window": None}


def tiny_config(**overrides) -> DraftConfig:
    return DraftConfig(**{**TINY, **overrides})


def random_state(cfg: DraftConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator) for name, shape in expected_tensor_shapes(cfg).items()}


def write_raw(folder, cfg: DraftConfig, tensors: dict[str, torch.Tensor]) -> None:
    """A checkpoint written without write_checkpoint's checks, to build broken files on purpose."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def refusal(folder) -> str:
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(folder)
    return str(info.value)


def test_expected_tensor_set():
    assert len(expected_tensor_shapes(tiny_config())) == 11 * 2 + 3
    shapes = expected_tensor_shapes(tiny_config(attention_bias=True))
    assert len(shapes) == 11 * 2 + 3 + 4 * 2 and shapes["layers.1.self_attn.o_proj.bias"] == (64,)
    assert shapes["fc.weight"] == (64, 128) and shapes["layers.0.self_attn.k_proj.weight"] == (32, 64)
    smollm2 = DraftConfig(**{**TINY, "hidden_size": 576, "num_hidden_layers": 5, "num_attention_heads": 9,
                             "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
                             "vocab_size": 49152, "num_target_layers": 30, "target_layer_ids": (1, 8, 14, 20, 27),
                             "layer_types": ("full_attention",) * 5})
    shapes = expected_tensor_shapes(smollm2)
    assert len(shapes) == 58 and sum(torch.Size(s).numel() for s in shapes.values()) == 19_361_152  # docs/format.md §2


def test_round_trip_single_file(tmp_path):
    cfg = tiny_config(provenance={"format": 1, "target": "tiny"})
    state = random_state(cfg)
    write_checkpoint(tmp_path, cfg, state, dtype=torch.float32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    with safe_open(tmp_path / "model.safetensors", framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["dtype"] == "float32" and "auto_map" not in written, "dflash.py is not shipped"
    loaded_cfg, loaded = read_checkpoint(tmp_path)
    assert loaded_cfg == cfg and list(loaded) == list(state)
    assert all(torch.equal(loaded[name], state[name]) for name in state)


def test_default_dtype_is_bf16_and_read_casts(tmp_path):
    cfg = tiny_config()
    write_checkpoint(tmp_path, cfg, random_state(cfg))
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert {t.dtype for t in read_checkpoint(tmp_path)[1].values()} == {torch.bfloat16}
    assert {t.dtype for t in read_checkpoint(tmp_path, dtype=torch.float32)[1].values()} == {torch.float32}


def test_round_trip_sharded(tmp_path):
    cfg = tiny_config()
    state = random_state(cfg)
    write_checkpoint(tmp_path, cfg, state, dtype=torch.float32, max_shard_size=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in state.values())
    assert not (tmp_path / "model.safetensors").exists()
    loaded_cfg, loaded = read_checkpoint(tmp_path)
    assert loaded_cfg == cfg and all(torch.equal(loaded[name], state[name]) for name in state)
    # Re-saving as one file must not leave shards behind that would make the folder ambiguous.
    write_checkpoint(tmp_path, cfg, state, dtype=torch.float32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


def test_write_never_overwrites_a_foreign_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "model.safetensors").write_bytes(b"target weights")
    with pytest.raises(CheckpointError, match="not a DFlash draft"):
        write_checkpoint(tmp_path, tiny_config(), random_state(tiny_config()))
    assert (tmp_path / "model.safetensors").read_bytes() == b"target weights"


def test_write_refuses_extra_missing_and_nonfinite(tmp_path):
    cfg = tiny_config()
    with pytest.raises(CheckpointError, match="mask_hidden"):
        write_checkpoint(tmp_path, cfg, {**random_state(cfg), "mask_hidden": torch.zeros(64)})
    state = random_state(cfg)
    del state["norm.weight"]
    with pytest.raises(CheckpointError, match="norm.weight"):
        write_checkpoint(tmp_path, cfg, state)
    state = random_state(cfg)
    state["fc.weight"][0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="fc.weight"):
        write_checkpoint(tmp_path, cfg, state)


def test_model_prefix_stripped_and_embedding_ignored(tmp_path):
    cfg = tiny_config()
    state = random_state(cfg)
    stored = {f"model.{name}": t for name, t in state.items()}
    stored.update({"embed_tokens.weight": torch.zeros(128, 64), "lm_head.weight": torch.zeros(128, 64)})
    write_raw(tmp_path, cfg, stored)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, loaded = read_checkpoint(tmp_path)
    messages = " ".join(str(w.message) for w in caught)
    assert "`model.` prefix" in messages and "lm_head" in messages
    assert set(loaded) == set(state) and torch.equal(loaded["fc.weight"], state["fc.weight"])


@pytest.mark.parametrize("key", ["mask_hidden", "layers.0.self_attn.qkv_proj.weight", "midlayer.fc.weight", "d2t"])
def test_unknown_tensor_refused(tmp_path, key):
    cfg = tiny_config()
    write_raw(tmp_path, cfg, {**random_state(cfg), key: torch.zeros(4)})
    message = refusal(tmp_path)
    assert key in message and "unexpected" in message


def test_missing_tensor_refused(tmp_path):
    cfg = tiny_config()
    state = random_state(cfg)
    del state["layers.1.mlp.down_proj.weight"]
    write_raw(tmp_path, cfg, state)
    assert "layers.1.mlp.down_proj.weight" in refusal(tmp_path)


def test_wrong_shape_names_tensor_expected_and_found(tmp_path):
    cfg = tiny_config()
    write_raw(tmp_path, cfg, {**random_state(cfg), "layers.0.self_attn.q_proj.weight": torch.zeros(32, 64)})
    message = refusal(tmp_path)
    assert "layers.0.self_attn.q_proj.weight" in message and "[32, 64]" in message and "[64, 64]" in message


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_weight_refused(tmp_path, value):
    cfg = tiny_config()
    state = random_state(cfg)
    state["layers.1.post_attention_layernorm.weight"][3] = value
    write_raw(tmp_path, cfg, state)
    message = refusal(tmp_path)
    assert "layers.1.post_attention_layernorm.weight" in message and "NaN/inf" in message


def test_integer_weight_refused(tmp_path):
    cfg = tiny_config()
    write_raw(tmp_path, cfg, {**random_state(cfg), "norm.weight": torch.ones(64, dtype=torch.int32)})
    message = refusal(tmp_path)
    assert "norm.weight" in message and "I32" in message


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "header"])
def test_corrupt_safetensors_refused(tmp_path, damage):
    cfg = tiny_config()
    write_raw(tmp_path, cfg, random_state(cfg))
    file = tmp_path / "model.safetensors"
    data = file.read_bytes()
    damaged = {"truncate": data[: len(data) // 2], "garbage": b"\x93NUMPY not a safetensors file" * 10,
               "empty": b"", "header": data[:8] + b"[" + data[9:]}[damage]
    file.write_bytes(damaged)
    message = refusal(tmp_path)
    assert "model.safetensors" in message and "corrupt" in message


def test_folder_and_config_errors(tmp_path):
    assert "does not exist" in refusal(tmp_path / "nowhere")
    assert "config.json is missing" in refusal(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    assert "not valid JSON" in refusal(tmp_path)
    data = tiny_config().to_dict()
    del data["dflash_config"]["mask_token_id"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"config.json: `dflash_config.mask_token_id` is required"):
        read_config(tmp_path)


def test_missing_or_ambiguous_weights_refused(tmp_path):
    cfg = tiny_config()
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert "neither model.safetensors nor" in refusal(tmp_path)
    write_checkpoint(tmp_path, cfg, random_state(cfg), max_shard_size=10_000)
    save_file(random_state(cfg), str(tmp_path / "model.safetensors"))
    assert "both" in refusal(tmp_path)


def test_sharded_index_problems_refused(tmp_path):
    cfg = tiny_config()
    write_checkpoint(tmp_path, cfg, random_state(cfg), max_shard_size=10_000)
    index_file = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    shard = index["weight_map"]["fc.weight"]
    index["weight_map"]["fc.weight"] = "model-00009-of-00009.safetensors"
    index_file.write_text(json.dumps(index))
    assert "model-00009-of-00009.safetensors" in refusal(tmp_path)
    other = next(f for f in index["weight_map"].values() if f not in (shard, "model-00009-of-00009.safetensors"))
    index["weight_map"]["fc.weight"] = other
    index_file.write_text(json.dumps(index))
    assert "fc.weight" in refusal(tmp_path), "an index that disagrees with its shards is a mixed download"
    index["weight_map"]["fc.weight"] = "../elsewhere.safetensors"
    index_file.write_text(json.dumps(index))
    assert "weight_map" in refusal(tmp_path)
