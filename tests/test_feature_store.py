"""The feature store (train/feature_store.py): the target's features written once beside the shards, read back by
training instead of a target forward, with the same result."""

from __future__ import annotations

import json

import pytest
import torch

from blockdraft.cli import main
from blockdraft.train.data import read_examples
from blockdraft.train.feature_store import FeatureStore, build_store, store_dir, token_digest
from blockdraft.train.features import FeatureCache
from blockdraft.train.forward import target_features
from blockdraft.train.trainer import train

from tiny_models import tiny_target
from train_fakes import assert_same_update, config, write_data

TAPS = (0, 1)  # the tiny target has 4 layers: the store stops after layer 1


def test_stopping_after_the_deepest_tap_gives_the_same_features():
    target = tiny_target("llama")
    tokens = torch.randint(3, 90, (2, 11))
    full = target_features(target, tokens, TAPS)
    assert torch.equal(target_features(target, tokens, TAPS, stop_after_taps=True), full), \
        "the layers past the deepest tap cannot change the tapped ones"
    with pytest.raises(ValueError, match="features only"):
        target.forward(tokens, torch.arange(11).expand(2, 11), target.new_cache(2, 11), TAPS,
                       logit_rows=torch.zeros(2, 1, dtype=torch.long), stop_after_taps=True)


def test_the_store_holds_each_sequences_own_features_and_resumes(tmp_path):
    target = tiny_target("llama")
    folder = write_data(tmp_path / "data", count=9)
    (folder / "data-00001.jsonl").write_text((folder / "data-00000.jsonl").read_text().replace('"ex', '"again'))
    done = build_store(target, folder, TAPS, batch_tokens=64)  # several batches of mixed lengths, padded
    assert done["shards_written"] == 2 and done["sequences"] == 18 - 9 + 9, done  # one entry per shard's sequences
    store = FeatureStore([store_dir(folder, target, TAPS)])
    assert len(store) == 9, "a token sequence is one entry, whichever shard repeats it"
    for example in read_examples(folder):
        alone = target_features(target, torch.tensor([example.input_ids]), TAPS)[0]  # [S, L*D]
        torch.testing.assert_close(store.get(token_digest(example.input_ids)), alone, rtol=1e-5, atol=1e-6,
                                   msg="padding after a sequence must not change its causal features")
    assert build_store(target, folder, TAPS)["shards_kept"] == 2, "a written shard is never computed again"


def test_features_read_from_the_store_are_not_kept_in_memory(tmp_path):
    target = tiny_target("llama")
    folder = write_data(tmp_path / "data", count=4)
    examples = read_examples(folder)
    build_store(target, folder, TAPS)
    disk = FeatureStore([store_dir(folder, target, TAPS)])
    digests = [token_digest(e.input_ids) for e in examples] + ["a sequence the store lacks"]
    cache = FeatureCache(target, TAPS, disk, digests)
    lengths = [len(e.input_ids) for e in examples[:2]] + [5]
    tokens = torch.zeros(3, max(lengths), dtype=torch.long)  # [B, S] right-padded
    for b, ids in enumerate([examples[0].input_ids, examples[1].input_ids, [7, 8, 9, 10, 11]]):
        tokens[b, : len(ids)] = torch.tensor(ids)
    for _ in range(2):
        out = cache.features(tokens, [0, 1, 4], lengths)  # [3, S, L*D]
        for b in range(2):
            torch.testing.assert_close(out[b, : lengths[b]], disk.get(digests[b]), rtol=0, atol=0)
        assert not out[0, lengths[0]:].any(), "padding rows are zeros"
    assert set(cache.store) == {4} and cache.forwards == 1 and cache.read == 4, \
        "stored sequences are read at every step and never held; only the target's own are kept"


def counting(target):
    rows = []
    forward = target.forward

    def counted(tokens, *args, **kwargs):
        rows.append(tokens.shape[0])
        return forward(tokens, *args, **kwargs)

    target.forward = counted
    return rows


def test_training_from_the_store_runs_no_target_forward_and_changes_nothing(tmp_path, capsys):
    write_data(tmp_path / "data", count=10)
    settings = dict(epochs=2, lr=1e-4, clip=1e9, val_fraction=0.2, eval_every=2, micro_batch_size=2,
                    target_layer_ids=TAPS)
    cached = train(tiny_target("llama"), config(tmp_path, "cached", cache_features=True, **settings)).parent
    target = tiny_target("llama")
    build_store(target, tmp_path / "data", TAPS)
    rows = counting(target)
    stored = train(target, config(tmp_path, "stored", feature_store=True, **settings)).parent
    assert "holds 10 of 10 sequences" in capsys.readouterr().out
    assert_same_update(cached, stored, "stored features must be the features a forward gives")
    assert sum(rows) <= 32, f"only the feature scale and evaluation may run the target, got {sum(rows)} rows"
    assert json.loads(open(stored / "metrics.jsonl").readlines()[-1])["loss"] == pytest.approx(
        json.loads(open(cached / "metrics.jsonl").readlines()[-1])["loss"], rel=1e-5)


def test_a_store_that_lacks_sequences_runs_the_target_for_them(tmp_path, capsys):
    write_data(tmp_path / "data", count=6)
    target = tiny_target("llama")
    rows = counting(target)
    train(target, config(tmp_path, "out", feature_store=True, epochs=1, target_layer_ids=TAPS))
    assert "holds 0 of 6 sequences" in capsys.readouterr().out and sum(rows) >= 6


def test_the_command_writes_the_store_for_a_drafts_taps(tmp_path, model_folders, capsys):
    target_path, draft_path = model_folders
    folder = write_data(tmp_path / "data", count=4)
    assert main(["features", "--data", str(folder), "--target", str(target_path), "--draft", str(draft_path),
                 "--target-dtype", "float32", "--threads", "1"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["shards_written"] == 1 and line["sequences"] == 4 and "taps" in line["store"]
    assert main(["features", "--data", str(folder), "--target", str(target_path), "--target-layer-ids", "0,99"]) == 2
    assert "must lie in" in capsys.readouterr().err
