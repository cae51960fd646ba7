"""Training over the proposal vocabulary: the loss the decoder's restricted distribution implies, nothing else."""

from __future__ import annotations

import json

import pytest
import torch

from blockdraft.decode.vocab import scatter_logits
from blockdraft.io.vocab import read_vocab, write_vocab
from blockdraft.errors import ConfigError
from blockdraft.train.data import Example, emitted_counts, emitted_tokens, frequent_tokens, read_examples
from blockdraft.train.evaluate import BlockMetrics
from blockdraft.train.objective import batch_vocab, block_targets, sample_anchors, scored_blocks, weighted_loss
from blockdraft.train.trainer import train

from tiny_models import VOCAB, tiny_target
from train_fakes import config, write_data

B, S, A, K, D = 2, 20, 4, 5, 8


def _case():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB // 2, (B, S), generator=g)  # labels among the lower half of the ids
    mask = torch.ones(B, S, dtype=torch.long)
    mask[:, :3] = 0
    anchors, keep = sample_anchors(mask, A, g)
    blocks = block_targets(tokens, mask, anchors, keep, K, 4.0)
    return tokens, blocks, torch.randn(B, A * K, D, generator=g), torch.randn(VOCAB, D, generator=g), \
        torch.randn(B, S, D, generator=g)


def test_the_whole_vocabulary_changes_nothing():
    _, blocks, hidden, head, teacher = _case()
    every = torch.arange(VOCAB)
    for kd in (0.0, 0.5):
        full, full_hits = weighted_loss(hidden, head, blocks, teacher=teacher, kd_weight=kd)
        sub, sub_hits = weighted_loss(hidden, head, blocks, teacher=teacher, kd_weight=kd, vocab=every)
        torch.testing.assert_close(sub, full)
        assert torch.equal(sub_hits, full_hits)


def test_a_subset_gives_the_decoders_restricted_distribution():
    tokens, blocks, hidden, head, teacher = _case()
    vocab = torch.unique(torch.cat([torch.arange(0, VOCAB, 3), tokens.flatten()]))  # every third id and the batch's
    total, hits = weighted_loss(hidden, head, blocks, teacher=teacher, kd_weight=0.5, vocab=vocab)
    # What the decoder drafts from: full logits with -inf outside the vocabulary (scatter_logits).
    w = blocks.weights.reshape(-1)
    rows = (w > 0).nonzero()[:, 0]
    logits = scatter_logits((hidden.reshape(-1, D)[rows] @ head.T)[:, vocab], vocab, VOCAB)
    y = blocks.labels.reshape(-1)[rows]
    where = (blocks.anchors[..., None] + torch.arange(K) - 1).clamp(min=0) + torch.arange(B)[:, None, None] * S
    t_logits = scatter_logits((teacher.reshape(B * S, D)[where.reshape(-1)[rows]] @ head.T)[:, vocab], vocab, VOCAB)
    log_q = logits.log_softmax(-1)
    ce = -log_q.gather(1, y[:, None])[:, 0]
    kd = -(t_logits.softmax(-1) * log_q.nan_to_num(neginf=0.0)).sum(-1)
    torch.testing.assert_close(total, (w[rows] * (0.5 * ce + 0.5 * kd)).sum(), rtol=1e-5, atol=1e-4)
    assert torch.equal(hits.reshape(-1)[rows], logits.argmax(-1) == y)
    sub_ce, _ = weighted_loss(hidden, head, blocks, vocab=vocab)
    assert sub_ce < weighted_loss(hidden, head, blocks)[0], "fewer competing ids: a lower CE"


def test_a_label_outside_the_vocabulary_is_refused():
    _, blocks, hidden, head, _ = _case()
    with pytest.raises(ValueError, match="outside"):
        weighted_loss(hidden, head, blocks, vocab=torch.arange(VOCAB // 2, VOCAB))
    assert batch_vocab(None, torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long)) is None


def test_a_batch_scores_its_prompt_ids_not_its_answers():
    """As the decoder joins a request's prompt ids to the proposal vocabulary, and no answer id it has not seen."""
    tokens = torch.tensor([[5, 6, 40, 41, 0], [7, 42, 43, 44, 45]])
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]])
    assert batch_vocab(torch.tensor([1, 41, 44]), tokens, mask).tolist() == [0, 1, 5, 6, 7, 41, 44]


def test_labels_outside_the_vocabulary_are_left_out():
    _, blocks, hidden, head, _ = _case()
    vocab = torch.arange(0, VOCAB, 2)  # the even ids
    kept = scored_blocks(blocks, vocab)
    even = blocks.labels % 2 == 0
    assert torch.equal(kept.weights, torch.where(even, blocks.weights, torch.zeros(())))
    assert (blocks.weights[~even] > 0).any(), "the case must hold odd labels to leave out"
    assert scored_blocks(blocks, None) is blocks
    total, hits = weighted_loss(hidden, head, kept, vocab=vocab)  # no label outside: no refusal
    assert not hits[~even].any()


def test_accuracy_counts_a_label_the_head_could_not_score_as_a_miss():
    metrics = BlockMetrics.zeros(3, "cpu")
    weights = torch.tensor([[[0.0, 1.0, 0.0]]])  # slot 2 left out of the loss ...
    supervised = torch.tensor([[[True, True, True]]])  # ... but the data supervises it
    metrics.add(torch.tensor(2.0), torch.tensor([[[False, True, False]]]), weights, supervised)
    summary = metrics.summary()
    assert summary["acc"] == [1.0, 0.0] and summary["loss"] == 2.0 and summary["tf_tau"] == 2.0
    metrics = BlockMetrics.zeros(3, "cpu")
    metrics.add(torch.tensor(2.0), torch.tensor([[[False, True, False]]]), weights)
    assert metrics.summary()["acc"] == [1.0, None], "without `supervised`: the scored slots alone"


def test_the_most_frequent_ids_break_ties_to_the_smaller_id():
    examples = [Example("a", [1, 9, 9, 8, 7, 7], [0, 1, 1, 1, 1, 1]), Example("b", [9, 8, 3], [1, 1, 0])]
    assert emitted_counts(examples) == {9: 3, 8: 2, 7: 2}
    assert frequent_tokens(examples, 2) == [7, 9] and frequent_tokens(examples, 1) == [9]
    assert frequent_tokens(examples, 10) == [7, 8, 9]


def test_training_with_a_head_over_the_most_frequent_ids(tmp_path):
    """`head_ids` = N: the draft written proposes the N most frequent response ids, and the run trains although most
    labels lie outside them (left out, never refused)."""
    write_data(tmp_path / "data", count=8)
    examples = read_examples(tmp_path / "data")
    out = train(tiny_target("llama"), config(tmp_path, "top", head_ids=2, max_steps=2, log_every=1))
    assert read_vocab(out, VOCAB).tolist() == frequent_tokens(examples, 2)
    assert len(set(emitted_tokens(examples))) > 2
    records = [json.loads(line) for line in open(tmp_path / "top" / "metrics.jsonl")]
    assert any(r.get("split") == "train" and r.get("loss") is not None for r in records)
    with pytest.raises(ConfigError, match="head_ids"):
        config(tmp_path, "bad", head_ids=1)


def test_a_continuation_keeps_the_head_ids_it_is_told_to(tmp_path):
    """`head_ids_from` = a draft folder: the run's head scores that folder's ids, not its own data's most frequent."""
    write_data(tmp_path / "data", count=8)
    parent = train(tiny_target("llama"), config(tmp_path, "parent", head_ids=3, max_steps=1))
    examples = read_examples(tmp_path / "data")
    chosen = [i for i in range(VOCAB) if i not in frequent_tokens(examples, 3)][:5]
    write_vocab(parent, chosen, VOCAB, "test")
    out = train(tiny_target("llama"), config(tmp_path, "child", init_from=parent, head_ids_from=parent, max_steps=1))
    assert read_vocab(out, VOCAB).tolist() == chosen
    with pytest.raises(ConfigError, match="keep one"):
        config(tmp_path, "both", head_ids=3, head_ids_from=parent)
    with pytest.raises(ConfigError, match="has no blockdraft_vocab.json"):
        config(tmp_path, "none", head_ids_from=tmp_path / "data")


def test_training_over_the_proposal_vocabulary(tmp_path):
    """With `proposal_vocab` the loss competes only over the ids the decoder drafts from (the data's response ids),
    so the same first step of the same draft scores a lower CE than over the whole vocabulary; the vocabulary
    written beside the draft is those ids."""
    write_data(tmp_path / "data", count=8)
    first_loss = {}
    for on in (False, True):
        out = train(tiny_target("llama"), config(tmp_path, f"vocab-{on}", proposal_vocab=on, max_steps=1,
                                                 log_every=1))
        records = [json.loads(line) for line in open(tmp_path / f"vocab-{on}" / "metrics.jsonl")]
        first_loss[on] = next(r["loss"] for r in records if r.get("split") == "train" and r.get("loss") is not None)
        assert sorted(read_vocab(out, VOCAB).tolist()) == [2, 60, 61, 62, 63, 64], "the data's response ids"
    assert first_loss[True] < first_loss[False], f"the head still scored every id: {first_loss}"


def test_a_continued_draft_keeps_its_starting_drafts_vocabulary(tmp_path):
    write_data(tmp_path / "data", count=8)
    first = train(tiny_target("llama"), config(tmp_path, "first", max_steps=1))
    emitted = read_vocab(first, VOCAB).tolist()  # the data's response ids: 60..64 and eos
    write_vocab(first, emitted + [7, 9], VOCAB, source="earlier data")  # ids the new data never emits
    second = train(tiny_target("llama"), config(tmp_path, "second", max_steps=1, init_from=first,
                                                proposal_vocab=True))
    assert read_vocab(second, VOCAB).tolist() == sorted(emitted + [7, 9])
    third = train(tiny_target("llama"), config(tmp_path, "third", max_steps=1))  # no init_from: the data's own
    assert read_vocab(third, VOCAB).tolist() == emitted
