"""Building the n-gram table of the target's own training answers (the table and its file: io/ngrams.py).

Every response token is counted after each of its contexts of n tokens (n in `orders`); a context is kept when it
was seen at least `min_count` times and one token followed it at least `min_share` of those times.

Shapes: T tokens of all sequences joined, E table entries.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..io.ngrams import HASH_MULT, NgramTable, hash_seed

ORDERS = (2, 3, 4, 6)
MIN_COUNT = 5
MIN_SHARE = 0.7


def build_table(sequences: Iterable[tuple[np.ndarray, int]], orders=ORDERS, min_count: int = MIN_COUNT,
                min_share: float = MIN_SHARE) -> NgramTable:
    """The table of (tokens [L], prompt length) sequences: every response token is counted after each of its
    `orders` contexts (which may reach into the prompt, never into another sequence)."""
    orders = tuple(sorted(set(int(n) for n in orders)))
    if not orders or orders[0] < 1:
        raise ValueError(f"orders must be positive context lengths, got {orders}")
    parts, targets, seen = [], [], 0
    for tokens, prompt_length in sequences:
        tokens = np.asarray(tokens, dtype=np.int64)
        is_target = np.zeros(tokens.shape[0] + 1, dtype=bool)
        is_target[prompt_length: tokens.shape[0]] = True
        parts += [tokens, np.array([-1])]  # -1 ends a sequence: no context spans two
        targets.append(is_target)
        seen += 1
    if not parts:
        return NgramTable(np.zeros(0, np.uint64), np.zeros(0, np.int32), orders, {"sequences": 0})
    x, target = np.concatenate(parts), np.concatenate(targets)  # [T]
    keys, nexts = [], []
    for n in orders:
        if x.shape[0] <= n:
            continue
        h = np.full(x.shape[0] - n, hash_seed(n), dtype=np.uint64)  # [T - n]: the context x[t-n : t] of target t
        clean = np.ones(x.shape[0] - n, dtype=bool)
        for j in range(n):
            column = x[j: x.shape[0] - n + j]
            clean &= column >= 0
            h = h * np.uint64(HASH_MULT) + column.astype(np.uint64)  # wraps mod 2^64, as context_hash
        keep = clean & target[n:]
        keys.append(h[keep])
        nexts.append(x[n:][keep])
    keys, nexts = np.concatenate(keys), np.concatenate(nexts)
    order = np.lexsort((nexts, keys))  # by key, then next token
    keys, nexts = keys[order], nexts[order]
    # Distinct (key, next) pairs and their counts.
    first = np.r_[True, (keys[1:] != keys[:-1]) | (nexts[1:] != nexts[:-1])]
    pair_keys, pair_next = keys[first], nexts[first]
    pair_count = np.diff(np.r_[np.flatnonzero(first), keys.shape[0]])
    # Per key: the most frequent next token (the smallest id among equals) and the key's total count.
    order = np.lexsort((pair_next, -pair_count, pair_keys))
    pair_keys, pair_next, pair_count = pair_keys[order], pair_next[order], pair_count[order]
    starts = np.flatnonzero(np.r_[True, pair_keys[1:] != pair_keys[:-1]])
    totals = np.add.reduceat(pair_count, starts)
    best = pair_count[starts]
    keep = (totals >= min_count) & (best >= min_share * totals)
    meta = {"sequences": seen, "response_tokens": int(target.sum()), "min_count": min_count, "min_share": min_share}
    return NgramTable(pair_keys[starts][keep], pair_next[starts][keep].astype(np.int32), orders, meta)
