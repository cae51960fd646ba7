"""Training data, configs and checkpoints for the trainer's tests (test_trainer, test_kd, test_resume, test_dpace,
test_train_vocab, test_train_evaluate) and `blockdraft data` over a fixed prompt set (test_regenerate, test_answers):
imported as `from train_fakes import ...`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from blockdraft.model.target import Target
from blockdraft.prompts.readers import Prompt

from tiny_models import VOCAB, char_tokenizer, tiny_target

if TYPE_CHECKING:
    from blockdraft.train.trainer import TrainConfig

MASK = VOCAB - 1


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
    """A few-step training config over `tmp_path / "data"`, writing to `tmp_path / name`; `overrides` win."""
    from blockdraft.train.trainer import TrainConfig

    values = dict(data_dirs=tmp_path / "data", out_dir=tmp_path / name, num_draft_layers=2, block_size=8, anchors=6,
                  max_seq_len=48, lr=2e-3, epochs=2, batch_size=4, save_every=1000, eval_every=1000, log_every=2,
                  val_fraction=0.0, mask_token_id=MASK)
    values.update(overrides)
    return TrainConfig(**values)


def tensors(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, by name."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


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


# ------------------------------------------------------------------------------------------------------------
# `blockdraft data` over a fixed prompt set (test_regenerate, test_answers)

PROMPTS = [Prompt(str(i), ({"role": "user", "content": "ab" * (i % 4 + 1) + str(i)},), "fake") for i in range(12)]
PROMPTS.append(Prompt("dup", PROMPTS[0].messages, "fake"))  # a duplicate of prompt 0


def prompted_target(monkeypatch) -> Target:
    """A tiny llama target with the character tokenizer, its training prompts set to PROMPTS."""
    from blockdraft.train import regenerate

    monkeypatch.setattr(regenerate, "training_prompts", lambda sets: PROMPTS)
    target = tiny_target("llama")
    target.tokenizer = char_tokenizer()
    return target


def build_greedy(target, out, count, **overrides):
    """`build_dataset` of `count` PROMPTS into `out`: short greedy answers in shards of 2; `overrides` win."""
    from blockdraft.train import regenerate

    settings = dict(sets=["fake"], count=count, max_prompt_tokens=64, max_new_tokens=6, batch_size=3, shard_size=2,
                    seed=1)
    return regenerate.build_dataset(target, out, **{**settings, **overrides})

