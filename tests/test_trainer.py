"""The trainer (TRAINING.md §6 tests 9-11, §7): frozen target, loss normalisation, checkpoints, resume, DDP.

Tiny fp32 targets, a few steps each. Exactness claims (micro-batches, resume, ranks) compare final weights.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from blockdraft.api import load_draft
from blockdraft.decode.generate import generate
from blockdraft.errors import CheckpointError, ConfigError, InputError
from blockdraft.train.ranks import rank_device
from blockdraft.model.target import Target
from blockdraft.train.trainer import TrainConfig, train

from conftest import VOCAB, tiny_draft, tiny_target

MASK = VOCAB - 1
TESTS = Path(__file__).parent


def write_data(folder: Path, count: int = 12, seed: int = 0, period: int = 5, empty: tuple[int, ...] = ()) -> Path:
    """Shards of prompt + a periodic response (learnable from the anchor alone); `empty` rows have no response mask."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "data-00000.jsonl", "w") as handle:
        for i in range(count):
            prompt = [1] + [rng.randrange(3, 60) for _ in range(rng.randrange(2, 6))]
            start = rng.randrange(period)
            response = [60 + (start + j) % period for j in range(rng.randrange(12, 30))] + [2]
            mask = [0] * (len(prompt) + len(response)) if i in empty else [0] * len(prompt) + [1] * len(response)
            handle.write(json.dumps({"id": f"ex{i}", "input_ids": prompt + response, "loss_mask": mask}) + "\n")
    return folder


def config(tmp_path: Path, name: str = "out", **overrides) -> TrainConfig:
    values = dict(data_dirs=tmp_path / "data", out_dir=tmp_path / name, num_draft_layers=2, block_size=8, anchors=6,
                  max_seq_len=48, lr=2e-3, epochs=2, batch_size=4, save_every=1000, eval_every=1000, log_every=2,
                  val_fraction=0.0, mask_token_id=MASK)
    values.update(overrides)
    return TrainConfig(**values)


def tensors(file: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(file), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


def tied_target() -> Target:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=1,
                                         eos_token_id=2, pad_token_id=0))
    return Target(model.float().eval())


# ---------------------------------------------------------------------------------------------------------
# Refusals before training


def test_refuses_mask_token_in_data(tmp_path):
    write_data(tmp_path / "data")
    with pytest.raises(ConfigError, match="mask token id 60 occurs"):
        train(tiny_target("llama"), config(tmp_path, mask_token_id=60))
    assert not (tmp_path / "out" / "checkpoint").exists()


def test_refuses_out_of_range_layer_ids(tmp_path):
    write_data(tmp_path / "data")
    with pytest.raises(ConfigError, match="target_layer_ids"):
        train(tiny_target("llama"), config(tmp_path, target_layer_ids=(1, 6)))


KILLED = dict(save_every=2, log_every=1, epochs=2)  # 8 examples, batch 4: 4 steps, checkpoints at 2 and 4


def killed_run(tmp_path: Path) -> None:
    """A run of 4 steps killed after its third, leaving the checkpoint of step 2 in tmp_path / "out"."""
    write_data(tmp_path / "data", count=8)

    def kill_after_three(step):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        train(tiny_target("llama"), config(tmp_path, **KILLED), on_step=kill_after_three)


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


@pytest.mark.parametrize("overrides", [{"max_seq_len": 4}, {}], ids=["all-truncated", "no-responses"])
def test_data_that_keeps_no_anchor_is_refused_before_training(tmp_path, overrides):
    # Every prompt is 3-6 tokens: cut at 4 tokens, or with no response supervised, no block can be trained.
    write_data(tmp_path / "data", count=4, empty=() if overrides else (0, 1, 2, 3))
    with pytest.raises(InputError, match="none of the 4 examples .* has two supervised tokens in a row"):
        train(tiny_target("llama"), config(tmp_path, **overrides))
    assert not (tmp_path / "out" / "draft").exists()


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


def test_data_of_another_target_or_an_unfinished_run_gets_a_note(tmp_path, capsys):
    write_data(tmp_path / "data", count=8)
    meta = {"target": "HuggingFaceTB/SmolLM2-135M-Instruct", "complete": False, "examples": 8, "prompts_requested": 50}
    (tmp_path / "data" / "meta.json").write_text(json.dumps(meta))
    target = tiny_target("llama")
    target.name = "tiny-llama"
    train(target, config(tmp_path, max_steps=1))
    out = capsys.readouterr().out
    assert "regenerated by 'HuggingFaceTB/SmolLM2-135M-Instruct', and this run trains for 'tiny-llama'" in out
    assert "stopped early (8 of 50 prompts)" in out


def test_refuses_empty_data(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(InputError, match="no data-"):
        train(tiny_target("llama"), config(tmp_path))
    (tmp_path / "data" / "data-00000.jsonl").write_text("")
    with pytest.raises(InputError, match="no training examples"):
        train(tiny_target("llama"), config(tmp_path))


def test_refuses_bad_settings(tmp_path):
    with pytest.raises(ConfigError, match="lr"):
        config(tmp_path, lr=0.0)
    with pytest.raises(ConfigError, match="gamma"):
        config(tmp_path, block_size=12)  # no published gamma for K=12
    assert config(tmp_path, block_size=12, gamma=6.0).loss_gamma == 6.0
    with pytest.raises(ConfigError, match="float16 needs loss scaling"):
        config(tmp_path, dtype="float16")


def test_each_torchrun_rank_trains_on_its_own_gpu():
    single = {"WORLD_SIZE": "1"}
    assert rank_device("cuda", single) == "cuda" and rank_device("cuda:1", {}) == "cuda:1"
    assert rank_device("cpu", {"WORLD_SIZE": "4", "LOCAL_RANK": "2"}) == "cpu"
    assert rank_device("cuda", {"WORLD_SIZE": "4", "LOCAL_RANK": "2"}) == "cuda:2"
    with pytest.raises(ConfigError, match="all 4 torchrun ranks on one GPU; pass --device cuda"):
        rank_device("cuda:0", {"WORLD_SIZE": "4", "LOCAL_RANK": "2"})
    with pytest.raises(ConfigError, match="LOCAL_RANK is not set"):
        rank_device("cuda", {"WORLD_SIZE": "4"})


def test_refuses_untied_head_of_a_tied_target(tmp_path):
    write_data(tmp_path / "data")
    target = tied_target()
    target.lm_head.weight = torch.nn.Parameter(target.lm_head.weight.detach().clone())
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        train(target, config(tmp_path))


# ---------------------------------------------------------------------------------------------------------
# §6.9 frozen and tied, §6.10 normalisation


@pytest.mark.parametrize("tied", [False, True])
def test_target_stays_frozen_and_out_of_checkpoints(tmp_path, tied):
    write_data(tmp_path / "data")
    target = tied_target() if tied else tiny_target("qwen3")
    before = {name: p.detach().clone() for name, p in target.model.named_parameters()}
    out = train(target, config(tmp_path, max_steps=3))
    for name, param in target.model.named_parameters():
        assert torch.equal(param, before[name]), f"target weight {name} changed during training"
        assert not param.requires_grad, f"target weight {name} must not take gradients"
    if tied:
        assert target.lm_head.weight is target.embed_tokens.weight, "a tied head must stay the embedding"
    trained = tensors(out / "model.safetensors")
    state = tensors(tmp_path / "out" / "checkpoint" / "trainer_state.safetensors")
    for names in (trained, tensors(tmp_path / "out" / "checkpoint" / "model.safetensors"), state):
        leaked = [n for n in names if "embed" in n or "lm_head" in n]
        assert not leaked, f"the target's embedding/head must never be saved, found {leaked}"
    assert {n.rsplit(".", 1)[0] for n in state} == set(trained), "optimizer state covers exactly the draft"
    assert trained["fc.weight"].dtype == torch.bfloat16, "the final draft is written in bf16"


def assert_same_update(a: Path, b: Path, why: str) -> None:
    """Same gradients (AdamW's moments: averaged gradients and squares) and the same weights.

    Moments get a tolerance of 1e-6 of each tensor's largest entry (fp32 summation order differs); a wrong
    normaliser is off by a factor. Weights get atol 1e-6 at lr 1e-4: Adam's g / (|g| + eps) turns rounding in
    near-zero gradients into differences proportional to lr, so the moments are the sharp comparison.
    """
    for file in ("trainer_state.safetensors", "model.safetensors"):
        x, y = tensors(a / "checkpoint" / file), tensors(b / "checkpoint" / file)
        assert x.keys() == y.keys()
        for name in x:
            atol = 1e-6 * float(x[name].abs().max()) if file.startswith("trainer") else 1e-6
            torch.testing.assert_close(y[name], x[name], rtol=1e-5, atol=atol, msg=f"{file}:{name}: {why}")


def test_micro_batches_give_the_update_of_one_batch(tmp_path):
    write_data(tmp_path / "data", count=8, empty=(3,))
    exact = dict(max_steps=3, lr=1e-4, clip=1e9)  # no clipping: it would hide a wrong scale of the gradient
    whole = train(tiny_target("llama"), config(tmp_path, "whole", **exact)).parent
    split = train(tiny_target("llama"), config(tmp_path, "split", micro_batch_size=2, **exact)).parent
    assert_same_update(whole, split, "micro-batches must share the step's normaliser W")


def counting_target() -> tuple[Target, list[int]]:
    """A tiny target whose forward records how many sequences each call runs."""
    target, rows = tiny_target("llama"), []
    forward = target.forward

    def counted(tokens, *args, **kwargs):
        rows.append(tokens.shape[0])
        return forward(tokens, *args, **kwargs)

    target.forward = counted
    return target, rows


def test_feature_cache_runs_the_target_once_per_sequence_and_changes_nothing(tmp_path):
    write_data(tmp_path / "data", count=10)
    settings = dict(epochs=3, lr=1e-4, clip=1e9, val_fraction=0.2, eval_every=2, micro_batch_size=2)
    plain_target, plain_rows = counting_target()
    plain = train(plain_target, config(tmp_path, "plain", **settings)).parent
    cached_target, cached_rows = counting_target()
    cached = train(cached_target, config(tmp_path, "cached", cache_features=True, **settings)).parent
    assert_same_update(plain, cached, "cached features must be the features a fresh forward gives")
    assert sum(cached_rows) == 10, f"each of the 10 sequences runs through the target once, got {sum(cached_rows)}"
    assert sum(plain_rows) > 3 * 8, "without the cache every epoch (and every evaluation) runs the target again"
    assert [json.loads(l) for l in open(plain / "metrics.jsonl")][-1]["loss"] == pytest.approx(
        [json.loads(l) for l in open(cached / "metrics.jsonl")][-1]["loss"], rel=1e-5)


def test_steps_without_anchors_are_skipped(tmp_path):
    # Three of four examples have no response: at one example a step, three steps of four have W = 0.
    write_data(tmp_path / "data", count=4, empty=(0, 1, 2))
    train(tiny_target("llama"), config(tmp_path, epochs=1, batch_size=1, log_every=1))
    records = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    assert records[-1]["skipped"] == 3 and [r["loss"] is None for r in records].count(True) == 3, records
    state = tensors(tmp_path / "out" / "checkpoint" / "trainer_state.safetensors")
    assert {int(state[name]) for name in state if name.endswith(".step")} == {1}, "skipped steps never reach AdamW"


@pytest.mark.parametrize(("target_dtype", "settings"), [
    (torch.float32, dict(cpu_autocast=True)), (torch.bfloat16, dict(dtype="float32")),
    (torch.bfloat16, dict(cpu_autocast=True)),
])
def test_precision_settings_train_and_evaluate(tmp_path, target_dtype, settings):
    write_data(tmp_path / "data")
    target = tiny_target("qwen3")
    target.model.to(target_dtype)
    out = train(target, config(tmp_path, max_steps=2, val_fraction=0.2, eval_every=2, **settings))
    records = [json.loads(line) for line in open(out.parent / "metrics.jsonl")]
    assert [r["split"] for r in records] == ["train", "val"] and records[1]["tf_tau"] >= 1.0
    master = tensors(out.parent / "checkpoint" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in master.values()), "master weights stay fp32 under autocast"


# ---------------------------------------------------------------------------------------------------------
# §6.11 round trip, resume, learning


def test_saved_draft_loads_and_decodes_like_the_target(tmp_path):
    write_data(tmp_path / "data")
    target = tiny_target("qwen3")
    out = train(target, config(tmp_path, max_steps=4))
    config_json = json.loads((out / "config.json").read_text())
    assert config_json["dflash_config"]["mask_token_id"] == MASK
    assert "target_arch_sha256" in config_json["blockdraft"], "the draft records which target it was trained for"
    draft = load_draft(out, target)
    prompts = [[1, 5, 9, 14], [1, 30, 31]]
    alone = generate(target, None, prompts, max_new_tokens=20, stop_token_ids=set())
    spec = generate(target, draft, prompts, max_new_tokens=20, stop_token_ids=set())
    assert [r.tokens for r in spec] == [r.tokens for r in alone], "greedy decode with the draft must equal the target's"


def test_init_from_continues_a_draft_and_must_match_it(tmp_path):
    write_data(tmp_path / "data")
    first = train(tiny_target("llama"), config(tmp_path, "first", max_steps=2))
    with pytest.raises(ConfigError, match="num_hidden_layers 3"):
        train(tiny_target("llama"), config(tmp_path, "second", max_steps=1, init_from=first, num_draft_layers=3))
    import shutil

    foreign = tmp_path / "foreign"
    shutil.copytree(first, foreign)
    record = json.loads((foreign / "config.json").read_text())
    record["blockdraft"]["target_arch_sha256"] = "0" * 64  # trained on a target of another architecture
    (foreign / "config.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="target_arch_sha256"):
        train(tiny_target("llama"), config(tmp_path, "third", max_steps=1, init_from=foreign))
    second = train(tiny_target("llama"), config(tmp_path, "second", max_steps=1, init_from=first, lr=1e-9))
    start, master = tensors(first / "model.safetensors"), tensors(second.parent / "checkpoint" / "model.safetensors")
    for name in start:  # one AdamW step moves each weight by about lr = 1e-9
        torch.testing.assert_close(master[name], start[name].float(), rtol=0, atol=1e-8,
                                   msg=f"{name}: init_from must start from the given draft's weights")


def test_val_folder_is_the_held_out_set(tmp_path):
    write_data(tmp_path / "data", count=8)
    write_data(tmp_path / "data" / "val", count=3, seed=5)
    out = train(tiny_target("llama"), config(tmp_path, max_steps=2, eval_every=2))
    val = [json.loads(line) for line in open(out.parent / "metrics.jsonl") if '"val"' in line]
    assert len(val) == 1 and val[0]["tf_tau"] is not None, "data/val/ must be evaluated even at val_fraction 0"


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


def test_several_data_folders_train_as_one_set_in_order(tmp_path):
    write_data(tmp_path / "a", count=6, seed=0)
    write_data(tmp_path / "b", count=6, seed=3)
    joined = tmp_path / "joined"
    joined.mkdir()
    for index, name in enumerate("ab"):
        (joined / f"data-{index:05d}.jsonl").write_text((tmp_path / name / "data-00000.jsonl").read_text())
    common = dict(max_steps=3, log_every=1, val_fraction=0.2)
    two = train(tiny_target("llama"), config(tmp_path, "two", data_dirs=[tmp_path / "a", tmp_path / "b"], **common))
    one = train(tiny_target("llama"), config(tmp_path, "one", data_dirs=joined, **common))
    a, b = tensors(two.parent / "checkpoint" / "model.safetensors"), tensors(one.parent / "checkpoint" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "two folders must train as their join"
    swapped = train(tiny_target("llama"), config(tmp_path, "ba", data_dirs=[tmp_path / "b", tmp_path / "a"], **common))
    c = tensors(swapped.parent / "checkpoint" / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a), "the folders' order must be the examples' order"
    state = json.loads((two.parent / "checkpoint" / "trainer_state.json").read_text())
    assert state["data"]["folders"] == f"{tmp_path / 'a'}, {tmp_path / 'b'}" and state["data"]["examples"] == 12
    with pytest.raises(ConfigError, match="names .* twice"):
        config(tmp_path, data_dirs=[tmp_path / "a", tmp_path / "b", tmp_path / "x" / ".." / "a"])
    with pytest.raises(ConfigError, match="at least one data folder"):
        config(tmp_path, data_dirs=[])


def test_a_val_folder_in_any_data_folder_is_held_out(tmp_path):
    write_data(tmp_path / "a", count=6)
    write_data(tmp_path / "b", count=6, seed=2)
    write_data(tmp_path / "b" / "val", count=3, seed=5)
    out = train(tiny_target("llama"), config(tmp_path, data_dirs=[tmp_path / "a", tmp_path / "b"],
                                             eval_every=3, epochs=1))
    state = json.loads((out.parent / "checkpoint" / "trainer_state.json").read_text())
    assert state["total_steps"] == 3, "all 12 examples of both folders train (batch 4), the 3 of b/val/ do not"
    val = [json.loads(line) for line in open(out.parent / "metrics.jsonl") if '"val"' in line]
    assert len(val) == 1 and val[0]["tf_tau"] is not None


def test_learns_a_repetitive_dataset(tmp_path):
    write_data(tmp_path / "data", count=40, seed=1)
    out = train(tiny_target("llama"), config(tmp_path, num_draft_layers=1, epochs=20, batch_size=8, anchors=8,
                                             lr=3e-3, val_fraction=0.1, eval_every=50, log_every=10))
    records = [json.loads(line) for line in open(out.parent / "metrics.jsonl")]
    val = [r for r in records if r["split"] == "val"]
    assert records[-1]["step"] == 100 and val, "every step logged and held-out data evaluated"
    assert val[-1]["acc"][0] > 0.5, f"acc_1 {val[-1]['acc'][0]} should be far above chance (1/{VOCAB})"
    assert val[-1]["tf_tau"] > 2.0 and val[-1]["loss"] < records[0]["loss"]
    assert (out.parent / "curves.png").stat().st_size > 0


# ---------------------------------------------------------------------------------------------------------
# §6.10 with torchrun: a rank without anchors must neither hang nor change the result


WORKER = """
import sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from conftest import tiny_target
from blockdraft.train.trainer import TrainConfig, train
train(tiny_target("llama"), TrainConfig(**{cfg!r}))
"""


@pytest.mark.slow
def test_two_gloo_ranks_with_an_anchorless_rank(tmp_path):
    # Two examples, batch 2: each step one rank gets the example without a supervised token.
    write_data(tmp_path / "data", count=2, empty=(1,))
    exact = dict(epochs=3, batch_size=2, log_every=1, lr=1e-4, clip=1e9)  # no clipping: it hides a wrong scale
    cfg = config(tmp_path, "ddp", **exact)
    fields = {k: str(v) if isinstance(v, Path) else v for k, v in cfg.__dict__.items()}
    fields["data_dirs"] = [str(folder) for folder in cfg.data_dirs]  # a tuple of paths: the worker's repr must read back
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER.format(tests=str(TESTS), cfg=fields)))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((tmp_path / "ddp" / "checkpoint" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == 3
    single = train(tiny_target("llama"), config(tmp_path, "single", **exact))
    assert_same_update(single.parent, tmp_path / "ddp", "two ranks must give the update of one process")
