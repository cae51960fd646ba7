"""The draft's pending context (decode/pending.py): ragged joins, the plain steps' deferred tail, row changes."""

import pytest
import torch

from blockdraft.decode import pending as pending_module
from blockdraft.decode.pending import TAIL_LIMIT, Pending, join_pending, pending_room

from tiny_models import tiny_draft, tiny_target


def test_join_pending_appends_each_rows_entries():
    old = torch.tensor([[[1.0], [2.0], [0.0]], [[5.0], [0.0], [0.0]]])  # counts 2 and 1 (0 is padding)
    new = torch.tensor([[[3.0], [9.0]], [[6.0], [7.0]]])  # counts 1 and 2
    joined, counts = join_pending(old, torch.tensor([2, 1]), new, torch.tensor([1, 2]))
    assert counts.tolist() == [3, 3]
    assert joined[0, :3, 0].tolist() == [1, 2, 3] and joined[1, :3, 0].tolist() == [5, 6, 7]


@pytest.mark.parametrize("rows", [1, 2])
def test_join_pending_grows_in_place_and_keeps_every_rows_entries(rows):
    """Many joins of ragged rows (as plain steps append them) equal one join of everything, and after the first
    they reuse one buffer instead of copying what came before."""
    generator = torch.Generator().manual_seed(0)
    pending, counts = torch.zeros(2, 1, 3), torch.tensor([1, 0])  # two rows: the scatter; one row: a slice copy
    pending[0, 0] = 1.0
    expected = [[pending[0, 0].clone()], []]
    storages = set()
    if rows == 1:
        pending, counts = pending[:1], counts[:1]
    for step in range(100):
        Q = 1 + step % 3
        new_counts = torch.tensor([1 + step % Q, Q])[:rows]  # row 0 keeps fewer than it is given
        new = torch.randn(rows, Q, 3, generator=generator)
        pending, counts = join_pending(pending, counts, new, new_counts)
        for b in range(rows):
            expected[b] += list(new[b, : int(new_counts[b])])
        storages.add(pending.untyped_storage().data_ptr())
        assert pending_room(pending) >= pending.shape[1]
    for b in range(rows):
        assert int(counts[b]) == len(expected[b])
        assert torch.equal(pending[b, : len(expected[b])], torch.stack(expected[b]))
    assert len(storages) <= 4  # the buffer doubles: a few copies for 100 joins, not one each
    assert pending_room(torch.zeros(2, 5, 3)) == 5 and pending_room(torch.zeros(2, 9, 3)[:, :4]) == 4
    assert pending_room(pending[[0]]) == pending.shape[1]  # rows kept by indexing are a fresh tensor


def ragged(rows: int, width: int, features: int, seed: int):
    """Pending features [rows, width, features] with counts [rows] from 0 to width."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, width + 1, (rows,), generator=generator)
    return torch.randn(rows, width, features, generator=generator), counts


@pytest.mark.parametrize("rows", [1, 3])
def test_deferred_plain_steps_equal_a_join_each_step(rows):
    # The tail must give every row exactly the entries that joining each plain step at once gave: past the tail
    # limit (a join inside `add_plain`), mixed with a lookup block's ragged entries, then rows leaving.
    features, counts = ragged(rows, 5, 4, seed=rows)
    lazy, eager = Pending(features.clone(), counts.clone()), (features.clone(), counts.clone())
    generator = torch.Generator().manual_seed(7)
    for step in range(TAIL_LIMIT + 30):
        if step % 50 == 49:  # a lookup block: ragged counts
            new, new_counts = torch.randn(rows, 3, 4, generator=generator), torch.randint(1, 4, (rows,))
            lazy.add(new, new_counts)
        else:
            new, new_counts = torch.randn(rows, 1, 4, generator=generator), torch.ones(rows, dtype=torch.long)
            lazy.add_plain(new)
        eager = join_pending(*eager, new, new_counts)
    for got, want in ((lazy.features, eager[0]), (lazy.counts, eager[1])):
        assert got.shape[0] == want.shape[0]
    for b in range(rows):
        n = int(eager[1][b])
        assert int(lazy.counts[b]) == n and torch.equal(lazy.features[b, :n], eager[0][b, :n]), \
            f"row {b}: the deferred tail lost or reordered entries"
    keep = torch.tensor([rows - 1])
    lazy.add_plain(torch.ones(rows, 1, 4))
    lazy.keep_rows(keep)
    n = int(eager[1][rows - 1]) + 1
    assert lazy.counts.tolist() == [n] and torch.equal(lazy.features[0, n - 1], torch.ones(4))


def test_plain_steps_join_once_per_tail_not_once_per_step(monkeypatch):
    # A batch that runs plain steps pays one join of the pending features per TAIL_LIMIT steps (the eager form
    # joined every step: tens of microseconds of a CPU step each).
    from blockdraft.decode.generate import generate
    from blockdraft.decode.proposers import TreeProposer
    from blockdraft.decode.drafter import Drafter

    class PlainOnly:
        def at_batch(self, rows): pass
        def choose(self): return 1
        def observe(self, width, num_accepted, within=None): pass

    joins = []
    real = pending_module.join_pending
    monkeypatch.setattr(pending_module, "join_pending", lambda *a: joins.append(1) or real(*a))
    target = tiny_target("llama")
    proposer = TreeProposer(Drafter(tiny_draft(target, block_size=4), target), PlainOnly())
    steps = 2 * TAIL_LIMIT + 10
    out = generate(target, proposer, [[1, 2, 3], [4, 5, 6, 7]], max_new_tokens=steps + 1, stop_token_ids=[])
    assert all(len(r.tokens) == steps + 1 for r in out)
    # One each time the tail fills up, and one as the rows end (their rows are dropped).
    assert len(joins) <= steps // TAIL_LIMIT + 1, f"{len(joins)} joins for {steps} plain steps"
