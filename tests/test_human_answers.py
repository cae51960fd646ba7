"""Human-written answers labelled by one target prefill (train/human_answers.py, docs/data.md §6): the labels
are the target's own greedy tokens, a slot counts only while the text followed the greedy path, and the shards
carry the labels through every reader."""

from __future__ import annotations

import json

import pytest
import torch

from blockdraft.errors import InputError
from blockdraft.prompts.readers import Prompt
from blockdraft.train import human_answers
from blockdraft.train.batches import data_fingerprint, make_micro_batch
from blockdraft.train.data import Example, emitted_tokens, read_examples, write_shard
from blockdraft.train.objective import block_targets, decay_weights

from tiny_models import char_tokenizer, tiny_target


def test_prefill_labels_follow_the_greedy_path_only():
    x = torch.arange(100, 116)[None]  # [1, S=16] the human text, x[t] = 100 + t
    g = torch.zeros_like(x)
    g[0, :-1] = x[0, 1:]  # the target would write the text ...
    g[0, 6], g[0, 9] = 7, 9  # ... except after positions 6 and 9
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    anchors, keep = torch.tensor([[4, 8, 2]]), torch.tensor([[True, True, True]])
    blocks = block_targets(x, mask, anchors, keep, 6, 4.0, greedy=g)
    decay = decay_weights(6, 4.0)
    # Anchor 4: slots 1..5 are labelled g[4..8] = 105, 106, 7, 108, 109; slot 3's label 7 is the target's, not
    # the text's 107, and the text left the path there: slots 4 and 5 (which would follow 107) count 0.
    assert blocks.labels[0, 0, 1:].tolist() == [105, 106, 7, 108, 109]
    assert torch.equal(blocks.weights[0, 0], torch.cat([decay[:4], torch.zeros(2)]))
    # Anchor 8: slot 1 predicts after x[8] (on path), slot 2 after x[9], whose greedy token 9 differs from x[10].
    assert blocks.labels[0, 1, 1:3].tolist() == [109, 9]
    assert torch.equal(blocks.weights[0, 1], torch.cat([decay[:3], torch.zeros(3)]))
    # Anchor 2: the text is on the path for 4 tokens, then slot 5 is labelled with g[6] = 7.
    assert blocks.labels[0, 2, 5].item() == 7 and torch.equal(blocks.weights[0, 2], decay)


def test_the_targets_own_text_gives_the_plain_labels():
    x = torch.randint(0, 50, (2, 12))
    mask = torch.ones_like(x)
    mask[:, :3] = 0
    g = torch.zeros_like(x)
    g[:, :-1] = x[:, 1:]  # regenerated text: the greedy token after t is x[t + 1]
    anchors = torch.tensor([[3, 7, 10], [4, 5, 9]])
    keep = torch.ones_like(anchors, dtype=torch.bool)
    plain, labelled = block_targets(x, mask, anchors, keep, 4, 4.0), block_targets(x, mask, anchors, keep, 4, 4.0, g)
    assert torch.equal(plain.labels, labelled.labels) and torch.equal(plain.weights, labelled.weights)


def test_a_micro_batch_takes_each_rows_labels():
    greedy = [t + 11 for t in range(19)] + [0]
    greedy[11] = 3  # after position 11 the target writes 3 where the text has 22
    human = Example("h", list(range(10, 30)), [0] * 4 + [1] * 16, greedy)
    own = Example("o", list(range(40, 60)), [0] * 4 + [1] * 16)
    mb = make_micro_batch([human, own], [0, 1], step=0, seed=0, num_anchors=16, block_size=4, gamma=4.0,
                          max_seq_len=64, device=torch.device("cpu"), dummy_index=0)
    for row, example in enumerate((human, own)):
        for j in range(16):
            p = int(mb.anchors[row, j])
            if not mb.keep[row, j]:
                continue
            x, g = example.input_ids, example.greedy or example.input_ids[1:] + [0]
            for k in range(1, 4):
                valid = p + k < len(x) and all(x[p + i] == g[p + i - 1] for i in range(1, k))
                assert (mb.blocks.weights[row, j, k] > 0) == valid, (row, p, k)
                if valid:
                    assert mb.blocks.labels[row, j, k] == g[p + k - 1], (row, p, k)


def labelled(count: int = 3) -> list[Example]:
    return [Example(f"e{i}", [5, 6, 7 + i, 8, 9], [0, 0, 1, 1, 1], [0, 7, 8, 3 + i, 2]) for i in range(count)]


@pytest.mark.parametrize("suffix", [".safetensors", ".jsonl"])
def test_shards_keep_the_labels(tmp_path, suffix):
    examples = labelled()
    write_shard(tmp_path / f"data-00000{suffix}", examples, tokenizer_sha256="abc", vocab_size=100)
    back = read_examples(tmp_path)
    assert [e.greedy for e in back] == [e.greedy for e in examples] and back == examples
    assert data_fingerprint(back) == data_fingerprint(examples)
    unlabelled = [Example(e.id, e.input_ids, e.loss_mask) for e in examples]
    assert data_fingerprint(unlabelled) != data_fingerprint(examples), "the labels are part of the data"


def test_a_shard_is_all_labelled_or_not_at_all(tmp_path):
    mixed = labelled(2) + [Example("own", [1, 2, 3], [0, 1, 1])]
    with pytest.raises(ValueError, match="greedy"):
        write_shard(tmp_path / "data-00000.safetensors", mixed, tokenizer_sha256="abc", vocab_size=100)


def test_a_damaged_label_line_is_refused(tmp_path):
    (tmp_path / "data-00000.jsonl").write_text(json.dumps({"id": "a", "input_ids": [1, 2], "loss_mask": [0, 1],
                                                           "greedy": [1]}) + "\n")
    with pytest.raises(InputError, match="greedy"):
        read_examples(tmp_path)


def test_the_proposal_vocabulary_holds_the_targets_labels():
    # Text ids 7, 8, 9 and the label 3 after 8; 2, after the last token, labels no slot.
    assert emitted_tokens(labelled(1)) == [3, 7, 8, 9]


CHATS = [Prompt(str(i), ({"role": "user", "content": "ab" * (i % 3 + 1)},
                         {"role": "assistant", "content": "cab" * (i % 4 + 6) + str(i)},
                         {"role": "user", "content": "more"}), "fake") for i in range(7)]
CHATS.append(Prompt("first", ({"role": "user", "content": "no answer before me"},), "fake"))
CHATS.append(Prompt("last", ({"role": "user", "content": "ab"}, {"role": "assistant", "content": "cab" * 7 + "z"}),
                    "fake"))  # a chat up to its last answer (sharegpt-answers)


@pytest.fixture
def target(monkeypatch):
    monkeypatch.setattr(human_answers, "training_prompts", lambda sets, answered=False: CHATS)
    monkeypatch.setattr(human_answers, "HUMAN_SETS", ("fake",))
    target = tiny_target("llama")
    target.tokenizer = char_tokenizer()
    return target


@torch.no_grad()
def test_labels_are_the_targets_argmax_after_each_position(target, tmp_path):
    meta = human_answers.build_human_dataset(target, tmp_path, sets=["fake"], count=10, max_answer_tokens=20,
                                             batch_size=3, shard_size=2)
    examples = read_examples(tmp_path)
    assert len(examples) == meta["examples"] == 8 and meta["skipped"]["no_human_answer"] == 1
    for example in examples:
        ids, start = example.input_ids, example.loss_mask.index(1)
        logits = target.model(torch.tensor([ids])).logits[0]  # [T, V] one forward of this row alone
        expected = logits.argmax(-1).tolist()
        assert example.greedy[start - 1:] == expected[start - 1:], "batched prefill = the row's own argmax"
        answer = target.tokenizer.decode(ids[start:])
        assert "cab" in answer, "the text is the human answer, not a generated one"


def test_other_sets_are_refused(target, tmp_path):
    with pytest.raises(InputError, match="--human-answers reads"):
        human_answers.build_human_dataset(target, tmp_path, sets=["codeio"], count=2)


def test_a_label_outside_the_embedding_is_refused_before_training():
    from types import SimpleNamespace

    from blockdraft.train.preflight import check_data

    draft_cfg = SimpleNamespace(mask_token_id=1, vocab_size=100)
    check_data(labelled(1), draft_cfg, "data")
    bad = Example("bad", [5, 6, 7], [0, 1, 1], [0, 6, 100])
    with pytest.raises(InputError, match="id 100, outside"):
        check_data([bad], draft_cfg, "data")


def test_a_human_answer_is_kept_beside_the_targets_own_to_the_same_prompt():
    from blockdraft.train.batches import first_of_each_prompt

    own = Example("sharegpt-turns:a", [5, 6, 7, 8], [0, 0, 1, 1])
    human = Example("sharegpt-turns:a:2", [5, 6, 9, 8], [0, 0, 1, 1], [0, 7, 8, 2])
    again = Example("other:a", [5, 6, 7, 8], [0, 0, 1, 1])  # the target's greedy answer once more
    repeats: list[str] = []
    kept = first_of_each_prompt([own, human, again], set(), repeats)
    assert kept == [own, human] and repeats == ["other:a"]


@torch.no_grad()
def test_the_prefill_writes_the_feature_store_as_blockdraft_features_would(target, tmp_path):
    from blockdraft.train.feature_store import FeatureStore, build_store, store_dir, token_digest
    from blockdraft.train.forward import target_features

    taps = (1, 3)
    human_answers.build_human_dataset(target, tmp_path, sets=["fake"], count=10, max_answer_tokens=20,
                                      batch_size=3, shard_size=2, feature_taps=taps)
    folder = store_dir(tmp_path, target, taps)
    store = FeatureStore([folder])
    examples = read_examples(tmp_path)
    assert len(store) == len({token_digest(e.input_ids) for e in examples}), "one entry per distinct sequence"
    for example in examples:
        alone = target_features(target, torch.tensor([example.input_ids]), taps)[0]  # [S, L*D]
        torch.testing.assert_close(store.get(token_digest(example.input_ids)), alone, rtol=1e-5, atol=1e-5)
    assert build_store(target, tmp_path, taps)["shards_written"] == 0, "a later `blockdraft features` keeps them"
