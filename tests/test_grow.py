"""grow.py: a draft grown by fresh layers computes what it grew from, learns in its new layers, and is refused where
the run's settings do not add up."""

from __future__ import annotations

import pytest
import torch

from blockdraft.errors import ConfigError
from blockdraft.io.checkpoint import read_checkpoint
from blockdraft.model.draft import DFlashDraftModel
from blockdraft.train.grow import grown_config, load_grown
from blockdraft.train.trainer import train

from tiny_models import tiny_draft, tiny_target
from train_fakes import config, tensors, write_data


def block_inputs(draft: DFlashDraftModel, seed: int = 0):
    """A block of 4 rows over 6 context positions: (embeds [1, 4, D], positions [1, 4], ctx [1, 6, D], mask)."""
    g = torch.Generator().manual_seed(seed)
    D = draft.config.hidden_size
    ctx = draft.project_context(torch.randn(1, 6, len(draft.config.target_layer_ids) * D, generator=g))
    return (torch.randn(1, 4, D, generator=g), torch.arange(6, 10)[None], ctx,
            torch.ones(1, 4, 10, dtype=torch.bool))


def forward(draft: DFlashDraftModel, inputs) -> torch.Tensor:
    embeds, positions, ctx, mask = inputs
    return draft(embeds, positions, draft.context_kv(ctx, torch.arange(6)[None]), mask)  # [1, 4, D]


def grown(start: DFlashDraftModel, extra: int) -> DFlashDraftModel:
    draft = DFlashDraftModel(grown_config(start.config, extra)).float()
    load_grown(draft, start.state_dict(), torch.Generator().manual_seed(1))
    return draft


def test_grown_draft_computes_what_it_grew_from_bit_for_bit():
    start = tiny_draft(tiny_target("qwen3"), layers=2)
    draft = grown(start, 2)
    assert len(draft.layers) == 4 and draft.config.layer_types == ("full_attention",) * 4
    inputs = block_inputs(start)
    with torch.no_grad():
        assert torch.equal(forward(draft.eval(), inputs), forward(start, inputs)), \
            "the new layers' residual branches must add exactly nothing at the start, or growing loses what was learnt"
    assert torch.equal(draft.layers[1].mlp.up_proj.weight, start.layers[1].mlp.up_proj.weight)
    assert draft.layers[2].mlp.up_proj.weight.abs().sum() > 0, "a new layer's other weights start random"


def test_the_first_backward_reaches_the_new_layer():
    draft = grown(tiny_draft(tiny_target("llama"), layers=1), 1).train()
    forward(draft, block_inputs(draft)).pow(2).sum().backward()
    new = draft.layers[1]
    for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
        assert new.get_parameter(name).grad.abs().sum() > 0, \
            f"{name} of a new layer must take a gradient at once, or the new layer never starts learning"


def test_tensors_that_do_not_fit_the_grown_draft_are_refused():
    start = tiny_draft(tiny_target("llama"), layers=2)
    draft = DFlashDraftModel(grown_config(start.config, 1))
    with pytest.raises(ConfigError, match="do not fit the grown draft"):
        load_grown(draft, {**start.state_dict(), "layers.0.extra.weight": torch.zeros(2)}, torch.Generator())


def test_training_grows_a_saved_draft_and_refuses_settings_that_do_not_add_up(tmp_path):
    write_data(tmp_path / "data", count=4)
    target = tiny_target("llama")
    train(target, config(tmp_path, "first", epochs=1))
    start = tmp_path / "first" / "draft"
    train(target, config(tmp_path, "grown", epochs=1, lr=1e-9, init_from=start, num_draft_layers=3, grow_layers=1))
    grown_cfg, _ = read_checkpoint(tmp_path / "grown" / "draft")
    assert grown_cfg.num_hidden_layers == 3
    saved = tensors(next((tmp_path / "grown" / "draft").glob("*.safetensors")))
    assert saved["layers.2.mlp.down_proj.weight"].abs().max() < 1e-6, "a new layer starts adding nothing"
    assert torch.equal(saved["layers.1.mlp.up_proj.weight"],
                       tensors(next(start.glob("*.safetensors")))["layers.1.mlp.up_proj.weight"])
    with pytest.raises(ConfigError, match=r"num_hidden_layers 2 vs the draft's 2 \+ grow_layers 1"):
        train(target, config(tmp_path, "wrong", init_from=start, num_draft_layers=2, grow_layers=1))
    with pytest.raises(ConfigError, match="set `init_from`"):
        config(tmp_path, grow_layers=1)
