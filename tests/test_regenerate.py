"""`blockdraft data` (build_dataset) on a tiny target: shards, meta, and resuming a stopped or finished run."""

from __future__ import annotations

import json

import pytest

from blockdraft.errors import InputError
from blockdraft.prompts.readers import Prompt
from blockdraft.train import regenerate
from blockdraft.train.data import read_examples

from conftest import char_tokenizer, tiny_target

PROMPTS = [Prompt(str(i), ({"role": "user", "content": "ab" * (i % 4 + 1) + str(i)},), "fake") for i in range(12)]
PROMPTS.append(Prompt("dup", PROMPTS[0].messages, "fake"))  # a duplicate of prompt 0


@pytest.fixture
def target(monkeypatch):
    monkeypatch.setattr(regenerate, "training_prompts", lambda sets: PROMPTS)
    target = tiny_target("llama")
    target.tokenizer = char_tokenizer()
    return target


def build(target, out, count, **overrides):
    settings = dict(sets=["fake"], count=count, max_prompt_tokens=64, max_new_tokens=6, batch_size=3, shard_size=2,
                    seed=1)
    return regenerate.build_dataset(target, out, **{**settings, **overrides})


def test_writes_shards_and_meta(target, tmp_path):
    meta = build(target, tmp_path, count=5)
    examples = read_examples(tmp_path)
    assert len(examples) == meta["examples"] == 5 and meta["complete"]
    assert sorted(p.name for p in tmp_path.glob("data-*.jsonl")) == [f"data-0000{i}.jsonl" for i in range(3)]
    assert meta["response_tokens"] == sum(sum(e.loss_mask) for e in examples)
    for example in examples:
        assert example.loss_mask[0] == 0 and example.loss_mask[-1] == 1, "prompt unsupervised, response supervised"


def test_resume_keeps_written_shards_and_adds_only_new_prompts(target, tmp_path, monkeypatch):
    build(target, tmp_path, count=4)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("data-*.jsonl")}
    regenerated = []
    generate = regenerate.generate
    monkeypatch.setattr(regenerate, "generate", lambda t, d, prompts, **kw: (regenerated.extend(prompts),
                                                                               generate(t, d, prompts, **kw))[1])
    meta = build(target, tmp_path, count=7)
    examples = read_examples(tmp_path)
    assert len(regenerated) == 3, "the 4 prompts already written are not regenerated"
    assert len({e.id for e in examples}) == len(examples) == meta["examples"] == 7
    assert all(tmp_path.joinpath(name).read_bytes() == data for name, data in before.items())
    assert meta["response_tokens"] == sum(sum(e.loss_mask) for e in examples)
    fresh = tmp_path / "fresh"
    build(target, fresh, count=7)
    assert sorted(e.id for e in read_examples(fresh)) == sorted(e.id for e in examples), "same prompts as one run"


def test_resume_with_other_settings_is_refused(target, tmp_path):
    build(target, tmp_path, count=2)
    with pytest.raises(InputError, match="max_new_tokens.*new --out"):
        build(target, tmp_path, count=4, max_new_tokens=9)
    assert json.loads((tmp_path / "meta.json").read_text())["max_new_tokens"] == 6
