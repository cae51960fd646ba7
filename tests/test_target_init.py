"""target_init.py: a draft started from the target's own layers, fc selecting the deepest tap; refused where the
shapes or counts cannot hold."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from blockdraft.errors import ConfigError
from blockdraft.model.draft import DFlashDraftModel
from blockdraft.train.target_init import copy_target_layers
from blockdraft.train.trainer import train

from tiny_models import tiny_draft, tiny_target
from train_fakes import config, tensors, write_data


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_draft_layers_take_the_target_layers_and_fc_selects_the_deepest_tap(family):
    target = tiny_target(family)
    draft = tiny_draft(target, layers=2)
    copy_target_layers(draft, target, (2, 3))
    for mine, theirs in zip(draft.layers, (target.layers[2], target.layers[3])):
        assert torch.equal(mine.self_attn.k_proj.weight, theirs.self_attn.k_proj.weight)
        assert torch.equal(mine.mlp.down_proj.weight, theirs.mlp.down_proj.weight)
        assert torch.equal(mine.post_attention_layernorm.weight, theirs.post_attention_layernorm.weight)
        if family == "qwen3":
            assert torch.equal(mine.self_attn.q_norm.weight, theirs.self_attn.q_norm.weight)
    assert torch.equal(draft.norm.weight, target.final_norm.weight)
    taps, D = draft.config.target_layer_ids, draft.config.hidden_size
    features = torch.randn(1, 3, len(taps) * D)  # [B, T, L*D]
    deepest = taps.index(max(taps))
    assert torch.equal(draft.fc(features), features[..., deepest * D : (deepest + 1) * D]), \
        "fc must start as the deepest tapped layer's output, what the target's later layers read"


def test_counts_and_shapes_that_cannot_hold_are_refused():
    target = tiny_target("llama")
    with pytest.raises(ConfigError, match="one target layer per draft layer"):
        copy_target_layers(tiny_draft(target, layers=2), target, (3,))
    with pytest.raises(ConfigError, match="must lie in"):
        copy_target_layers(tiny_draft(target, layers=1), target, (9,))
    narrow = dataclasses.replace(tiny_draft(target, layers=1).config, intermediate_size=8)
    with pytest.raises(ConfigError, match="cannot take the target's"):
        copy_target_layers(DFlashDraftModel(narrow), target, (3,))


def test_training_starts_from_the_target_layers_and_refuses_two_starts(tmp_path):
    write_data(tmp_path / "data", count=4)
    target = tiny_target("llama")
    train(target, config(tmp_path, epochs=1, init_target_layers=(2, 3), lr=1e-9, standardize_features=True))
    saved = tensors(next((tmp_path / "out" / "draft").glob("*.safetensors")))
    expected = target.layers[3].mlp.down_proj.weight.detach()
    assert torch.allclose(saved["layers.1.mlp.down_proj.weight"].float(), expected, atol=1e-2), \
        "a run with --init-target-layers must start from the target's layers"
    with pytest.raises(ConfigError, match="keep one"):
        config(tmp_path, init_target_layers=(2, 3), init_from=tmp_path / "out" / "draft")
