"""The continuation rule (decode/continuation.py): which earlier occurrence a row's run follows."""

from __future__ import annotations

import torch

from blockdraft.decode.continuation import continuation


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values)


def test_continuation_takes_the_longest_most_recent_match():
    assert continuation(ids(1, 2, 3, 9, 1, 2, 3), 3).tolist() == [9, 1, 2]
    # [0, 2, 3] never occurred before; [2, 3] did, twice: the later one wins.
    assert continuation(ids(5, 2, 3, 7, 1, 2, 3, 8, 0, 2, 3), 3).tolist() == [8, 0, 2]
    # A 3-gram match beats a more recent 2-gram one.
    assert continuation(ids(4, 2, 3, 6, 9, 2, 3, 7, 4, 2, 3), 2).tolist() == [6, 9]
    assert continuation(ids(1, 2, 3, 4), 3).tolist() == []  # nothing repeats
    assert continuation(ids(5, 1, 5), 3).tolist() == []  # a 1-gram match is below min_ngram 2
    assert continuation(ids(5, 1, 5), 3, min_ngram=1).tolist() == [1, 5]  # stops at the context's end
    assert continuation(ids(7), 3, min_ngram=1).tolist() == []


def test_the_occurrence_sharing_the_longest_suffix_wins():
    # [1, 2, 3] occurs twice before the end; the earlier one shares 5 tokens with the end, the later one 3.
    context = ids(7, 8, 1, 2, 3, 4, 5, 9, 1, 2, 3, 6, 7, 8, 1, 2, 3)
    assert continuation(context, 2).tolist() == [4, 5]
    assert continuation(context, 2, max_ngram=3).tolist() == [6, 7], "capped at 3: the most recent of equals"


def slow_continuation(values: list[int], count: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The rule by its definition: the longest n from max_ngram down whose n-gram occurred before, most recent."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(values) <= n:
            continue
        starts = [i for i in range(len(values) - n) if values[i : i + n] == values[-n:]]
        if starts:
            return values[starts[-1] + n : starts[-1] + n + count]
    return []


def test_continuation_matches_its_definition_on_random_contexts():
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        context = torch.randint(0, 3 + trial % 5, (int(torch.randint(1, 60, (1,), generator=g)),), generator=g)
        for max_ngram, min_ngram in ((16, 2), (4, 1), (3, 3)):
            expected = slow_continuation(context.tolist(), 5, max_ngram, min_ngram)
            assert continuation(context, 5, max_ngram, min_ngram).tolist() == expected, (context.tolist(), max_ngram)
