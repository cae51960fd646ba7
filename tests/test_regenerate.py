"""`blockdraft data` (build_dataset) on a tiny target: shards, meta, magpie prompts, and resuming a stopped or
finished run (old JSON Lines folders included)."""

from __future__ import annotations

import functools
import json

import pytest

from blockdraft.decode.decoder import Decoder
from blockdraft.errors import InputError
from blockdraft.train import regenerate
from blockdraft.train.data import Example, read_examples, write_shard
from blockdraft.train.shards import tokenizer_fingerprint

from train_fakes import build_greedy, prompted_target


@pytest.fixture
def target(monkeypatch):
    return prompted_target(monkeypatch)


def contents(examples):
    return sorted((e.id, e.input_ids, e.loss_mask) for e in examples)


def test_writes_shards_and_meta(target, tmp_path):
    meta = build_greedy(target, tmp_path, count=5)
    examples = read_examples(tmp_path)
    assert len(examples) == meta["examples"] == 5 and meta["complete"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("data-")) == [
        f"data-0000{i}.safetensors" for i in range(3)], "binary shards, shard_size examples each"
    assert meta["tokenizer_sha256"] == tokenizer_fingerprint(target.tokenizer)
    assert meta["response_tokens"] == sum(sum(e.loss_mask) for e in examples)
    for example in examples:
        assert example.loss_mask[0] == 0 and example.loss_mask[-1] == 1, "prompt unsupervised, response supervised"


def test_resume_keeps_written_shards_and_adds_only_new_prompts(target, tmp_path, monkeypatch):
    build_greedy(target, tmp_path, count=4)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("data-*.safetensors")}
    regenerated = []
    generate = Decoder.generate
    monkeypatch.setattr(Decoder, "generate", lambda self, prompts, **kw: (regenerated.extend(prompts),
                                                                          generate(self, prompts, **kw))[1])
    meta = build_greedy(target, tmp_path, count=7)
    examples = read_examples(tmp_path)
    assert len(regenerated) == 3, "the 4 prompts already written are not regenerated"
    assert len({e.id for e in examples}) == len(examples) == meta["examples"] == 7
    assert all(tmp_path.joinpath(name).read_bytes() == data for name, data in before.items())
    assert meta["response_tokens"] == sum(sum(e.loss_mask) for e in examples)
    fresh = tmp_path / "fresh"
    build_greedy(target, fresh, count=7)
    assert sorted(e.id for e in read_examples(fresh)) == sorted(e.id for e in examples), "same prompts as one run"


def test_skip_held_draws_only_prompts_another_folder_lacks(target, tmp_path):
    build_greedy(target, tmp_path / "a", count=5)
    held = {tuple(e.input_ids[: e.loss_mask.index(1)]) for e in read_examples(tmp_path / "a")}
    meta = build_greedy(target, tmp_path / "b", count=5, seed=2, skip_held=[tmp_path / "a"])
    fresh = read_examples(tmp_path / "b")
    assert len(fresh) == meta["examples"] == 5, "held prompts do not count toward --count"
    assert not held & {tuple(e.input_ids[: e.loss_mask.index(1)]) for e in fresh}
    assert meta["skipped"]["held_elsewhere"] > 0
    unfiltered = build_greedy(target, tmp_path / "c", count=5, seed=2)
    assert unfiltered["skipped"]["held_elsewhere"] == 0
    with pytest.raises(InputError, match="names the --out folder"):
        build_greedy(target, tmp_path / "a", count=6, skip_held=[tmp_path / "a"])


def test_resume_with_other_settings_is_refused(target, tmp_path):
    build_greedy(target, tmp_path, count=2)
    with pytest.raises(InputError, match="max_new_tokens.*new --out"):
        build_greedy(target, tmp_path, count=4, max_new_tokens=9)
    assert json.loads((tmp_path / "meta.json").read_text())["max_new_tokens"] == 6


@pytest.mark.parametrize("name", ["count", "batch_size", "shard_size", "max_new_tokens"])
def test_counts_below_one_are_refused_by_name(target, tmp_path, name):
    # shard_size 0 wrote empty shards forever; count 0 regenerated every prompt.
    with pytest.raises(InputError, match=f"`{name}` must be a whole number >= 1"):
        build_greedy(target, tmp_path, **{"count": 4, name: 0})


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
    meta = build_greedy(target, tmp_path, count=4)
    assert meta["skipped"]["empty_response"] == 1 and meta["examples"] == 3
    asked = []
    monkeypatch.setattr(Decoder, "generate", lambda decoder, prompts, **kw: (asked.extend(prompts),
                                                                          generate(decoder, prompts, **kw))[1])
    meta = build_greedy(target, tmp_path, count=4)
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


def test_a_run_stopped_midway_leaves_a_usable_folder_and_resumes_to_the_same_data(target, tmp_path, monkeypatch):
    calls, generate = [], Decoder.generate

    def stopped_at_third_batch(decoder, prompts, **kw):
        calls.append(len(prompts))
        if len(calls) == 3:
            raise KeyboardInterrupt  # a stop while the third batch decodes
        return generate(decoder, prompts, **kw)

    monkeypatch.setattr(Decoder, "generate", stopped_at_third_batch)
    with pytest.raises(KeyboardInterrupt):
        build_greedy(target, tmp_path / "stopped", count=9)
    monkeypatch.setattr(Decoder, "generate", generate)
    meta = json.loads((tmp_path / "stopped" / "meta.json").read_text())
    partial = read_examples(tmp_path / "stopped")
    assert not meta["complete"] and len(partial) == meta["examples"] == 6, "two batches of 3 in 3 shards of 2"
    build_greedy(target, tmp_path / "stopped", count=9)
    build_greedy(target, tmp_path / "whole", count=9)
    assert contents(read_examples(tmp_path / "stopped")) == contents(read_examples(tmp_path / "whole"))


def test_an_old_json_lines_folder_is_read_and_resumed_with_binary_shards(target, tmp_path):
    build_greedy(target, tmp_path, count=4)
    old = read_examples(tmp_path)
    for shard in sorted(tmp_path.glob("data-*.safetensors")):  # the folder as an earlier version wrote it
        examples = [Example(e.id, e.input_ids, e.loss_mask) for e in read_examples(shard)]
        write_shard(shard.with_suffix(".jsonl"), examples)
        shard.unlink()
    meta = json.loads((tmp_path / "meta.json").read_text())
    del meta["tokenizer_sha256"], meta["magpie"]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    assert read_examples(tmp_path) == old, "JSON Lines shards read back as the same examples"
    meta = build_greedy(target, tmp_path, count=7)
    names = sorted(p.name for p in tmp_path.glob("data-*"))
    assert names == ["data-00000.jsonl", "data-00001.jsonl", "data-00002.safetensors", "data-00003.safetensors"]
    examples = read_examples(tmp_path)
    assert examples[:4] == old and len({e.id for e in examples}) == meta["examples"] == 7
    build_greedy(target, tmp_path / "fresh", count=7)
    assert contents(examples) == contents(read_examples(tmp_path / "fresh")), "as if written by one run"


def test_shards_stay_under_the_byte_bound(target, tmp_path):
    bound = 700
    meta = build_greedy(target, tmp_path, count=8, shard_size=100, max_shard_bytes=bound)
    shards = sorted(tmp_path.glob("data-*.safetensors"))
    sizes = [len(read_examples(shard)) for shard in shards]
    assert len(shards) > 1 and sum(sizes) == meta["examples"] == 8, "the byte bound, not shard_size, cut them"
    assert all(shard.stat().st_size <= bound for shard, n in zip(shards, sizes) if n > 1), \
        [shard.stat().st_size for shard in shards]


def test_a_shard_of_another_tokenizer_is_refused_on_resume(target, tmp_path):
    build_greedy(target, tmp_path, count=2)
    target.tokenizer.add_tokens(["<extra>"])  # another vocabulary: ids would mean other tokens
    with pytest.raises(InputError, match="tokenizer_sha256"):
        build_greedy(target, tmp_path, count=4)


def test_magpie_prompts_take_their_share_and_grow_with_count(target, tmp_path, monkeypatch):
    # The tiny target's random prompts are short: keep every one that ends its turn.
    monkeypatch.setattr(regenerate, "MagpieSettings", functools.partial(regenerate.MagpieSettings, min_chars=1))
    settings = dict(sets=["fake", "magpie"], magpie_fraction=0.5, batch_size=4)
    def magpie_ids(meta):
        ids = [e.id for e in read_examples(tmp_path)] + meta["empty_response_ids"]
        return sorted(i for i in ids if i.startswith("magpie:"))

    meta = build_greedy(target, tmp_path, count=4, **settings)
    assert len(magpie_ids(meta)) == 2 and meta["magpie"]["fraction"] == 0.5, "half of count 4"
    tried = meta["magpie_prompts"]["candidates"]
    meta = build_greedy(target, tmp_path, count=8, **settings)
    assert len(magpie_ids(meta)) == 4 and meta["magpie_prompts"]["candidates"] > tried, "the list grew"
    build_greedy(target, tmp_path / "fresh", count=8, **settings)
    assert contents(read_examples(tmp_path)) == contents(read_examples(tmp_path / "fresh")), \
        "a grown run holds what one run of the larger count holds"
    with pytest.raises(InputError, match="magpie"):
        build_greedy(target, tmp_path, count=8, **{**settings, "magpie_fraction": 0.25})
