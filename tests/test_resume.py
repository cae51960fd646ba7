"""Resuming a training run (docs/training.md §7): a killed run continues to the weights of an uninterrupted one, and
a checkpoint, log or setting it cannot continue from is refused by name before any step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from blockdraft.errors import CheckpointError, ConfigError, InputError
from blockdraft.train.trainer import train

from tiny_models import tiny_draft, tiny_target
from train_fakes import config, tensors, write_data


class Killed(Exception):
    pass


@pytest.mark.parametrize("standardize", [False, True], ids=["raw-features", "standardized-features"])
def test_resume_equals_an_uninterrupted_run(tmp_path, standardize):
    write_data(tmp_path / "data", count=12)
    # 10 training examples, batch 4: 3 steps per epoch, 2 epochs = 6 steps; checkpoints at 2 and 4; killed after 5.
    common = dict(save_every=2, log_every=1, val_fraction=0.2, eval_every=3, standardize_features=standardize)
    reference = train(tiny_target("llama"), config(tmp_path, "reference", **common)).parent

    def kill_after_five(step):
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        train(tiny_target("llama"), config(tmp_path, "resumed", **common), on_step=kill_after_five)
    state = json.loads((tmp_path / "resumed" / "checkpoint" / "trainer_state.json").read_text())
    assert (state["step"], state["epoch"], state["position"]) == (4, 1, 1)
    resumed = train(tiny_target("llama"), config(tmp_path, "resumed", **common)).parent
    for file in ("model.safetensors", "trainer_state.safetensors"):
        a, b = tensors(reference / "checkpoint" / file), tensors(resumed / "checkpoint" / file)
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), f"{file}:{name} differs after resume"
    steps = [(r["split"], r["step"]) for r in map(json.loads, open(resumed / "metrics.jsonl"))]
    assert steps == [(r["split"], r["step"]) for r in map(json.loads, open(reference / "metrics.jsonl"))]
    with pytest.raises(ConfigError, match="lr"):
        train(tiny_target("llama"), config(tmp_path, "resumed", **{**common, "lr": 1e-3}))
    with pytest.raises(InputError, match="resume"):
        train(tiny_target("llama"), config(tmp_path, "resumed", **{**common, "resume": False}))
    assert state["data"]["examples"] == 12
    (tmp_path / "data" / "data-00000.jsonl").rename(tmp_path / "data" / "data-00001.jsonl")
    write_data(tmp_path / "more", count=3, seed=9)
    (tmp_path / "more" / "data-00000.jsonl").rename(tmp_path / "data" / "data-00000.jsonl")
    with pytest.raises(InputError, match="12 examples .* 15 other or reordered examples"):
        train(tiny_target("llama"), config(tmp_path, "resumed", **common))


KILLED = dict(save_every=2, log_every=1, epochs=2)  # 8 examples, batch 4: 4 steps, checkpoints at 2 and 4


def killed_run(tmp_path: Path) -> None:
    """A run of 4 steps killed after its third, leaving the checkpoint of step 2 in tmp_path / "out"."""
    write_data(tmp_path / "data", count=8)

    def kill_after_three(step):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        train(tiny_target("llama"), config(tmp_path, **KILLED), on_step=kill_after_three)


def test_a_resumed_run_goes_on_with_its_checkpoints_clock(tmp_path):
    write_data(tmp_path / "data", count=8)
    settings = dict(KILLED, epochs=4, time_budget=1e6, log_every=1)  # 8 steps; checkpoints every 2

    def kill_after_three(step):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        train(tiny_target("llama"), config(tmp_path, **settings), on_step=kill_after_three)
    state = json.loads((tmp_path / "out" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["elapsed"] > 0, state
    steps = []
    train(tiny_target("llama"), config(tmp_path, **dict(settings, time_budget=state["elapsed"] * 0.999)),
          on_step=steps.append)
    assert steps == [], "the budget was spent before the checkpoint: a resumed run must not start it again"
    steps.clear()
    train(tiny_target("llama"), config(tmp_path, **dict(settings, time_budget=1e6)), on_step=steps.append)
    assert steps == [3, 4, 5, 6, 7, 8], "a larger budget trains the resumed run further"


def test_a_resume_with_the_target_in_another_dtype_is_refused(tmp_path):
    killed_run(tmp_path)
    target = tiny_target("llama")
    target.model.to(torch.bfloat16)  # its features, the draft's inputs, would change mid-run
    with pytest.raises(ConfigError, match="its target ran in float32, this one in bfloat16; pass --target-dtype"):
        train(target, config(tmp_path, **KILLED))


def test_a_metrics_line_cut_by_a_kill_does_not_block_resume(tmp_path):
    killed_run(tmp_path)
    log = tmp_path / "out" / "metrics.jsonl"
    log.write_text(log.read_text() + '{"split": "train", "st')  # the kill cut the last record
    train(tiny_target("llama"), config(tmp_path, **KILLED))
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 4
    log.write_text('{"split": "train", "step": 1}\nnot json\n{"split": "train", "step": 2}\n')
    with pytest.raises(InputError, match="metrics.jsonl, line 2: not valid JSON"):
        train(tiny_target("llama"), config(tmp_path, **KILLED))


@pytest.mark.parametrize("damage", ["truncated-state", "no-config", "wrong-shape", "missing-moment"])
def test_a_damaged_checkpoint_is_refused_by_file_on_resume(tmp_path, damage):
    from safetensors.torch import save_file

    killed_run(tmp_path)
    folder = tmp_path / "out" / "checkpoint"
    state_file, json_file = folder / "trainer_state.safetensors", folder / "trainer_state.json"
    moments = tensors(state_file)
    if damage == "truncated-state":
        state_file.write_bytes(state_file.read_bytes()[:100])
    elif damage == "no-config":
        state = json.loads(json_file.read_text())
        del state["config"]
        json_file.write_text(json.dumps(state))
    else:
        name = next(k for k in moments if k.endswith(".exp_avg"))
        if damage == "wrong-shape":
            moments[name] = torch.zeros(3)
        else:
            del moments[name]
        save_file(moments, str(state_file))
    wanted = {"truncated-state": "trainer_state.safetensors cannot be read", "no-config": "lacks \\['config'\\]",
              "wrong-shape": "has exp_avg \\[3\\]", "missing-moment": "lacks \\['exp_avg'\\]"}[damage]
    with pytest.raises(CheckpointError, match=wanted):
        train(tiny_target("llama"), config(tmp_path, **KILLED))


def test_a_resume_compares_draft_configs_by_field_naming_aside():
    import dataclasses

    from blockdraft.train.checkpointing import config_differences

    cfg = tiny_draft(tiny_target("llama"), layers=2, block_size=8).config
    saved = dataclasses.replace(cfg, provenance={"format": 1, "target": "/models/t", "version": "0.1.0",
                                                 "tokenizer_sha256": "ab", "target_arch_sha256": "cd"})
    respelt = dataclasses.replace(saved, provenance={**saved.provenance, "target": "/models/t/", "version": "0.2.0"})
    assert config_differences(saved, respelt) == [], "another spelling of the target, or a release, is no change"
    other = dataclasses.replace(respelt, provenance={**respelt.provenance, "tokenizer_sha256": "ef"},
                                mask_token_id=cfg.mask_token_id - 1)
    assert config_differences(saved, other) == [
        f"mask_token_id: saved {cfg.mask_token_id}, now {cfg.mask_token_id - 1}",
        "provenance.tokenizer_sha256: saved 'ab', now 'ef'"]
