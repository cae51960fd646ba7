"""Bounded draft memory (cache.ContextWindow): the draft context keeps its first `sinks` and latest `window`
positions, in a fixed number of slots, and the block sees exactly those."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockdraft.decode.drafter import Drafter
from blockdraft.decode.generate import generate
from blockdraft.decode.proposers import TargetAlone
from blockdraft.cache import ContextWindow
from blockdraft.errors import InputError

from step_fakes import proposer
from tiny_models import random_prompts, tiny_draft, tiny_target

FEATURES = 64 * 2  # the tiny target's hidden size times the draft's two tapped layers


@settings(max_examples=60, deadline=None)
@given(window=st.integers(1, 6), sinks=st.integers(0, 3),
       appends=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=8))
def test_the_kept_slots_hold_the_sinks_and_the_latest_positions(window, sinks, appends):
    # Two ragged rows append chunks of positions (padded to the longer chunk); each row's first lengths[b]
    # slots must then hold exactly its first `sinks` and its latest `window` positions, each once.
    w = ContextWindow(window, sinks)
    slots = [[None] * w.capacity for _ in range(2)]
    seen = torch.zeros(2, dtype=torch.long)
    for counts in appends:
        counts = torch.tensor(counts)
        width = max(int(counts.max()), 1)
        positions = seen[:, None] + torch.arange(width)
        valid = torch.arange(width)[None, :] < counts[:, None]
        total = seen + counts
        where = w.slots(positions, valid, total)
        for b in range(2):
            for j in range(width):
                if int(where[b, j]) < w.capacity - 1:
                    assert valid[b, j], "padding must go to the slot that is never read"
                    slots[b][int(where[b, j])] = int(positions[b, j])
        seen = total
        for b, length in enumerate(w.lengths(total).tolist()):
            n = int(total[b])
            want = set(range(min(sinks, n))) | set(range(max(n - window, 0), n))
            assert sorted(slots[b][:length]) == sorted(want), (b, slots[b], want)


def reference_logits(drafter: Drafter, features, kept: list[int], anchor: int, position: int):
    """The draft's block logits with only the context positions `kept` visible (their own absolute positions)."""
    draft, target, K = drafter.draft, drafter.target, drafter.block_size
    ctx = draft.project_context(features[:, kept])
    ctx_kv = draft.context_kv(ctx, torch.tensor([kept]))
    block = torch.full((1, K), draft.config.mask_token_id)
    block[0, 0] = anchor
    positions = position + torch.arange(K)[None]
    mask = torch.ones(1, K, len(kept) + K, dtype=torch.bool)
    hidden = draft(target.embed_tokens(block), positions, ctx_kv, mask)
    return target.logits(hidden[:, 1:])


@pytest.mark.parametrize("chunks", [[23], [5, 1, 9, 3, 5]])
def test_a_windowed_draft_sees_exactly_its_sinks_and_latest_positions(chunks):
    target = tiny_target("llama")
    draft = tiny_draft(target, layers=2, block_size=8)
    torch.manual_seed(5)
    features = torch.randn(1, sum(chunks), FEATURES)
    window = ContextWindow(window=6, sinks=2)
    drafter = Drafter(draft, target, window=window)
    drafter.start(1, 64)
    done = 0
    with torch.no_grad():
        for n in chunks:
            drafter.append_context(features[:, done: done + n], torch.tensor([n]))
            done += n
            kept = sorted(set(range(min(2, done))) | set(range(max(done - 6, 0), done)))
            got = drafter.propose(torch.tensor([7]), torch.tensor([done]))
            torch.testing.assert_close(got, reference_logits(drafter, features, kept, 7, done), atol=1e-5, rtol=1e-5)
    assert drafter.cache.capacity == window.capacity == 9, "memory is the window's, not the context's"


def test_a_window_wider_than_the_context_changes_nothing_and_rows_keep_their_own():
    target = tiny_target("llama")
    draft = tiny_draft(target, layers=2, block_size=8)
    torch.manual_seed(6)
    features = torch.randn(2, 12, FEATURES)
    counts, anchors, positions = torch.tensor([5, 12]), torch.tensor([3, 4]), torch.tensor([5, 12])
    logits = {}
    with torch.no_grad():
        for name, window in (("whole", None), ("wide", ContextWindow(64)), ("narrow", ContextWindow(4, sinks=1))):
            drafter = Drafter(draft, target, window=window)
            drafter.start(2, 32)
            drafter.append_context(features, counts)
            logits[name] = drafter.propose(anchors, positions)
        assert torch.equal(logits["wide"], logits["whole"])
        # In a batch, each row keeps its own window: row 0 (5 positions) its sink and positions 1-4 (all five),
        # row 1 its sink 0 and positions 8-11.
        torch.testing.assert_close(logits["narrow"][0], logits["whole"][0], atol=1e-5, rtol=1e-5)
        alone = Drafter(draft, target, window=ContextWindow(4, sinks=1))
        alone.start(1, 32)
        alone.append_context(features[1:], counts[1:])
        torch.testing.assert_close(logits["narrow"][1], alone.propose(anchors[1:], positions[1:])[0], atol=1e-5,
                                   rtol=1e-5)
        assert not torch.allclose(logits["narrow"][1], logits["whole"][1], atol=1e-3), "row 1 lost positions 1-7"


def test_decoding_with_a_small_window_stays_exact_in_batches():
    target = tiny_target("llama")
    draft = tiny_draft(target, layers=2, block_size=6)
    prompts = random_prompts([3, 17, 9], seed=8)
    alone = [r.tokens for r in generate(target, TargetAlone(), prompts, max_new_tokens=30, stop_token_ids=[])]
    draft.context_window = ContextWindow(window=5, sinks=2)
    for modes in ({}, {"tree": True, "adaptive": True, "lookup": True}):
        got = [r.tokens for r in generate(target, proposer(target, draft, **modes), prompts, max_new_tokens=30,
                                          stop_token_ids=[])]
        assert got == alone, modes


def test_a_window_refuses_sizes_that_keep_nothing():
    with pytest.raises(InputError, match="context window must be a whole number of positions >= 1"):
        ContextWindow(0)
    with pytest.raises(InputError, match="sink positions"):
        ContextWindow(8, sinks=-2)
