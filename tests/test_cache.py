"""KVCache rows leaving and joining: every valid slot as a gather and a concatenation would give, in place."""

from __future__ import annotations

import torch

from blockdraft.cache import KVCache


def filled(batch: int, lengths: list[int], seed: int) -> KVCache:
    """A cache of 2 layers, 2 heads, 12 slots, head dim 3, random K/V and the given lengths."""
    cache = KVCache(2, batch, 2, 12, 3, torch.float32, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    for tensor in (*cache.keys, *cache.values):
        tensor.copy_(torch.randn(tensor.shape, generator=generator))
    cache.lengths = torch.tensor(lengths)
    return cache


def valid(cache: KVCache) -> list[list[torch.Tensor]]:
    """Each row's slots below its length, per layer, keys then values (copies: rows move in place)."""
    return [[t[b, :, :n].clone() for t in (*cache.keys, *cache.values)] for b, n in enumerate(cache.lengths.tolist())]


def same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_rows_leave_and_join_in_place_with_every_valid_slot_kept():
    cache = filled(5, [7, 3, 12, 5, 9], seed=0)
    reference = valid(cache)
    storage = cache.keys[0].untyped_storage().data_ptr()
    cache.keep_rows(torch.tensor([0, 2, 4]))  # rows 1 and 3 leave: 2 and 4 move down
    assert same(valid(cache), [reference[0], reference[2], reference[4]])
    joining = filled(2, [4, 11], seed=1)
    cache.add_rows(joining)  # into the room the leaving rows left
    assert same(valid(cache), [reference[0], reference[2], reference[4], *valid(joining)])
    assert cache.keys[0].untyped_storage().data_ptr() == storage, "rows that fit the room must not reallocate"
    assert cache.keys[0].shape[0] == 5 and cache.lengths.tolist() == [7, 12, 9, 4, 11]


def test_rows_beyond_the_room_and_in_any_order_are_gathered():
    cache = filled(3, [4, 8, 2], seed=2)
    reference = valid(cache)
    cache.keep_rows(torch.tensor([2, 0]))  # not ascending
    assert same(valid(cache), [reference[2], reference[0]])
    joining = filled(3, [5, 1, 6], seed=3)
    cache.add_rows(joining)  # more than the room: new tensors
    assert same(valid(cache), [reference[2], reference[0], *valid(joining)])
    cache.keep_rows(torch.tensor([], dtype=torch.long))
    assert cache.keys[0].shape[0] == 0
    cache.add_rows(filled(1, [3], seed=4))
    assert cache.keys[0].shape[0] == 1 and cache.lengths.tolist() == [3]
