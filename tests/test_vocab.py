"""The draft's proposal vocabulary: a speed option that must never change what is decoded."""

from __future__ import annotations

import json

import pytest
import torch

from blockdraft.io.drafts import LoadedDraft
from blockdraft.api import load_draft
from blockdraft.decode.drafter import Drafter
from blockdraft.decode.generate import generate
from blockdraft.decode.proposers import TargetAlone
from blockdraft.decode.vocab import scatter_logits
from blockdraft.io.vocab import VOCAB_FILE, read_vocab, write_vocab
from blockdraft.train.data import emitted_tokens
from blockdraft.errors import CheckpointError
from blockdraft.io.checkpoint import write_checkpoint
from blockdraft.train.data import Example

from step_fakes import proposer
from tiny_models import VOCAB, tiny_draft, tiny_target

PROMPTS = [[1, 5, 9, 13, 17], [3, 4], [7, 8, 9, 10, 11, 12, 13, 14, 15]]
WORDS = torch.tensor([2, 20, 21, 22, 40, 41, 60, 61, 62, 63])


def test_emitted_tokens_are_the_supervised_ids():
    examples = [Example("a", [1, 7, 8, 7, 2], [0, 0, 1, 1, 1]), Example("b", [5, 9, 3], [0, 1, 0])]
    assert emitted_tokens(examples) == [2, 7, 8, 9]


def test_scatter_puts_each_logit_at_its_id():
    full = scatter_logits(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([0, 4, 5]), 7)
    assert full[0, [0, 4, 5]].tolist() == [1.0, 2.0, 3.0]
    assert torch.isinf(full[0, [1, 2, 3, 6]]).all() and (full[0, [1, 2, 3, 6]] < 0).all()


def test_propose_scores_vocabulary_and_prompt_ids_only():
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=8)
    full, limited = Drafter(draft, target), Drafter(LoadedDraft(draft, vocab=WORDS), target)
    prompt = PROMPTS[0]
    features = target.forward(torch.tensor([prompt]), torch.arange(len(prompt))[None],
                              target.new_cache(1, len(prompt)), full.tap_layer_ids).features
    logits = []
    for drafter in (full, limited):
        drafter.start(1, 32, [prompt])
        drafter.append_context(features[:, :-1], torch.tensor([len(prompt) - 1]))
        logits.append(drafter.propose(torch.tensor([prompt[-1]]), torch.tensor([len(prompt) - 1])))
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[WORDS] = True
    allowed[prompt] = True
    assert torch.isneginf(logits[1][..., ~allowed]).all()
    torch.testing.assert_close(logits[1][..., allowed], logits[0][..., allowed], rtol=1e-5, atol=1e-5)


def test_the_vocabulary_head_is_built_once_and_again_after_the_head_changes():
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=8)
    first, second = Drafter(LoadedDraft(draft, vocab=WORDS), target), Drafter(LoadedDraft(draft, vocab=WORDS), target)
    first.start(1, 32, [PROMPTS[0]])
    second.start(1, 32, [PROMPTS[1]])
    assert first.head is second.head, "one gather and pack per vocabulary, not per request"
    with torch.no_grad():
        target.lm_head.weight.mul_(2.0)
    third = Drafter(LoadedDraft(draft, vocab=WORDS), target)
    third.start(1, 32, [PROMPTS[0]])
    assert third.head is not first.head, "a changed head weight must not be served from the cache"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_output_unchanged_by_the_vocabulary(family):
    target = tiny_target(family)
    draft = tiny_draft(target, block_size=8)
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=30, stop_token_ids=[])
    spec = generate(target, proposer(target, Drafter(LoadedDraft(draft, vocab=WORDS), target)), PROMPTS,
                    max_new_tokens=30, stop_token_ids=[])
    assert [s.tokens for s in spec] == [b.tokens for b in base]


def _draft_folder(tmp_path):
    target = tiny_target("llama")
    draft = tiny_draft(target)
    write_checkpoint(tmp_path, draft.config, draft.state_dict())
    return target, tmp_path


def test_load_draft_reads_the_sidecar_and_full_vocab_ignores_it(tmp_path):
    target, folder = _draft_folder(tmp_path)
    assert load_draft(folder, target).vocab is None
    write_vocab(folder, [9, 3, 3, 40], VOCAB, source="test")
    assert load_draft(folder, target).vocab.tolist() == [3, 9, 40]
    assert load_draft(folder, target, full_vocab=True).vocab is None


@pytest.mark.parametrize("record, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"format": "other"}), "is not a"),
    (json.dumps({"format": "blockdraft-draft-vocab-v1", "vocab_size": 5, "token_ids": [1]}), "another target"),
    (json.dumps({"format": "blockdraft-draft-vocab-v1", "vocab_size": VOCAB, "token_ids": [3, 1]}), "sorted"),
    (json.dumps({"format": "blockdraft-draft-vocab-v1", "vocab_size": VOCAB, "token_ids": [1, VOCAB]}), "sorted"),
    (json.dumps({"format": "blockdraft-draft-vocab-v1", "vocab_size": VOCAB, "token_ids": []}), "non-empty"),
])
def test_bad_sidecar_is_refused_with_the_fix(tmp_path, record, message):
    (tmp_path / VOCAB_FILE).write_text(record)
    with pytest.raises(CheckpointError, match=message) as error:
        read_vocab(tmp_path, VOCAB)
    assert "delete" in str(error.value)


def test_prompt_only_ids_are_the_prompts_ids_outside_the_vocabulary():
    """Against its definition as sets, on random unsorted vocabularies (a request's active ids are the
    vocabulary's, then earlier prompts' extras) and prompts with ids past the vocabulary's largest."""
    from blockdraft.decode.vocab import prompt_only_ids

    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        V = int(torch.randint(2, 200, (1,), generator=generator))
        ids = torch.randperm(V, generator=generator)[: int(torch.randint(1, V, (1,), generator=generator))]
        prompts = [torch.randint(0, V + 5, (int(torch.randint(0, 20, (1,), generator=generator)),),
                                 generator=generator).tolist() for _ in range(2)]
        expected = sorted({t for p in prompts for t in p} - set(ids.tolist()))
        assert prompt_only_ids(ids, prompts).tolist() == expected
        assert prompt_only_ids(ids, torch.tensor(prompts[0], dtype=torch.long)).tolist() == sorted(
            set(prompts[0]) - set(ids.tolist()))
