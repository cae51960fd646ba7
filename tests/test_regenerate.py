"""`blockdraft data` (build_dataset) on a tiny target: shards, meta, and resuming a stopped or finished run."""

from __future__ import annotations

import json

import pytest

from blockdraft.decode.decoder import Decoder
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
    generate = Decoder.generate
    monkeypatch.setattr(Decoder, "generate", lambda self, prompts, **kw: (regenerated.extend(prompts),
                                                                          generate(self, prompts, **kw))[1])
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


@pytest.mark.parametrize("name", ["count", "batch_size", "shard_size", "max_new_tokens"])
def test_counts_below_one_are_refused_by_name(target, tmp_path, name):
    # shard_size 0 wrote empty shards forever; count 0 regenerated every prompt.
    with pytest.raises(InputError, match=f"`{name}` must be a whole number >= 1"):
        build(target, tmp_path, **{"count": 4, name: 0})


def test_an_empty_response_is_remembered_not_regenerated(target, tmp_path, monkeypatch):
    from blockdraft.decode.generate import GenerationResult

    generate = Decoder.generate

    def first_one_empty(decoder, prompts, **kw):
        results = generate(decoder, prompts, **kw)
        return [GenerationResult([], "stop", r.stats) if ids == prompts_seen[0] else r
                for ids, r in zip(prompts, results)]

    prompts_seen = []
    monkeypatch.setattr(Decoder, "generate",
                        lambda decoder, prompts, **kw: (prompts_seen or prompts_seen.append(prompts[0]),
                                                        first_one_empty(decoder, prompts, **kw))[1])
    meta = build(target, tmp_path, count=4)
    assert meta["skipped"]["empty_response"] == 1 and meta["examples"] == 3
    asked = []
    monkeypatch.setattr(Decoder, "generate", lambda decoder, prompts, **kw: (asked.extend(prompts),
                                                                          generate(decoder, prompts, **kw))[1])
    meta = build(target, tmp_path, count=4)
    assert asked == [] and meta["skipped"]["empty_response"] == 1, "counted once, never regenerated"


def test_a_shard_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    import blockdraft.train.data as data

    data.write_shard(tmp_path / "data-00000.jsonl", [data.Example("a", [1, 2], [0, 1])])

    def killed(source, destination):  # the process dies after writing, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(data.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        data.write_shard(tmp_path / "data-00000.jsonl", [data.Example("b", [3, 4, 5], [0, 1, 1])] * 3)
    monkeypatch.undo()
    assert [e.id for e in read_examples(tmp_path)] == ["a"], "the old shard stands; the new copy lies aside"


@pytest.mark.parametrize("mask", [[0, 1.0], [0, True], [0, [1]]])
def test_a_loss_mask_of_other_types_is_refused_by_line(tmp_path, mask):
    (tmp_path / "data-00000.jsonl").write_text(json.dumps({"id": "x", "input_ids": [1, 2], "loss_mask": mask}) + "\n")
    with pytest.raises(InputError, match="line 1: .*`loss_mask` only 0/1"):
        read_examples(tmp_path)
