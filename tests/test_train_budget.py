"""Training to a wall-clock budget and drafts written while training (docs/training.md §8, "One GPU window")."""

from __future__ import annotations

import json
import math

import pytest

from blockdraft.api import load_draft
from blockdraft.errors import CheckpointError
from blockdraft.train.trainer import train

from tiny_models import tiny_target
from train_fakes import config, write_data


def ticking_clock(monkeypatch) -> None:
    """The trainer's clock reads 0, 1, 2, ...: it is read once before the first step and once after each step, so
    step k ends at second k."""
    import blockdraft.train.trainer as trainer

    ticks = iter(range(10_000))
    monkeypatch.setattr(trainer, "monotonic", lambda: float(next(ticks)))


def test_a_time_budget_stops_after_the_step_that_crosses_it(tmp_path, monkeypatch):
    ticking_clock(monkeypatch)
    write_data(tmp_path / "data")
    cfg = config(tmp_path, epochs=100, log_every=1, time_budget=2.5)  # 300 steps without the budget
    out = train(tiny_target("llama"), cfg)
    state = json.loads((tmp_path / "out" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 3, "step 3 ends at second 3, the first past 2.5 s: the run stops there, checkpointed"
    assert load_draft(out, tiny_target("llama")).config.num_hidden_layers == 2, "the final draft is written"
    # The schedule ends with the budget: step 3 starts 2 s of 2.5 in, at position 300 * 2 / 2.5 = 240 of 300.
    total, warmup, lr = 300, 12, [r["lr"] for r in map(json.loads, open(tmp_path / "out" / "metrics.jsonl"))]
    cosine = 0.5 * cfg.lr * (1 + math.cos(math.pi * (240 - warmup) / (total - warmup)))
    assert lr[2] == pytest.approx(cosine), "the learning rate follows the clock when it is ahead of the steps"


def test_the_draft_is_written_every_interval_and_atomically(tmp_path, monkeypatch):
    import blockdraft.train.checkpointing as checkpointing

    ticking_clock(monkeypatch)
    write_data(tmp_path / "data")
    written, steps = [], []
    real_write_vocab = checkpointing.write_vocab

    def write_vocab(folder, *args, **kwargs):
        # A kill while the third draft is written: only its .partial folder is unfinished.
        written.append(len(steps) + 1)
        if len(written) == 3:
            raise KeyboardInterrupt("killed while writing")
        return real_write_vocab(folder, *args, **kwargs)

    monkeypatch.setattr(checkpointing, "write_vocab", write_vocab)
    cfg = config(tmp_path, epochs=10, max_steps=8, save_draft_every_seconds=2,
                 draft_dir=tmp_path / "returned" / "draft")
    with pytest.raises(KeyboardInterrupt):
        train(tiny_target("llama"), cfg, on_step=steps.append)
    assert written == [2, 4, 6], "a draft after every 2 s of training (step k ends at second k)"
    folder = tmp_path / "returned" / "draft"
    assert (tmp_path / "returned" / "draft.partial").is_dir(), "the third write was cut short in its temporary folder"
    assert load_draft(folder, tiny_target("llama")), "the draft of step 4 is whole and loads"
    assert not (tmp_path / "out" / "draft").exists(), "the draft goes where draft_dir says"


def test_a_draft_folder_holding_something_else_is_never_replaced(tmp_path):
    write_data(tmp_path / "data")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="holds no DFlash draft"):
        train(tiny_target("llama"), config(tmp_path, max_steps=1, draft_dir=tmp_path / "notes"))
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
