"""An n-gram table of the target's own answers: the token it wrote after each context it met often, and surely.

A draft is trained on answers the target regenerated itself (docs/training.md). The same answers say, without any
model, what the target tends to write next: after "Here is a Python" it wrote "function" nearly every time. The
table keeps, for each context of n tokens (n in `orders`) seen at least `min_count` times before a response token,
the token that followed it, when that token followed at least `min_share` of those times. A lookup tries the
longest order first.

It is a third source of guesses beside the draft and prompt lookup (lookup.py): where a row's context has no
earlier occurrence to copy from, its table continuation is grafted instead, verified like any guess, so output
stays exact (greedy: the target's own; sampling: a point mass, lookup.py). It costs no model forward, which
matters where a target step is cheap: on the int4 target a drafted step costs 1.75 plain steps, a verify of two
rows without the draft 1.3.

Keys are 64-bit hashes of (n, the n tokens); two contexts that collide share an entry, which can only cost a
wrong guess. The file beside a draft's weights is `blockdraft_ngrams.safetensors` (docs/format.md).

Shapes: E table entries, L context length.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..errors import CheckpointError

NGRAMS_FILE = "blockdraft_ngrams.safetensors"
FORMAT = "blockdraft-ngrams"
VERSION = "1"
ORDERS = (2, 3, 4, 6)
MIN_COUNT = 5
MIN_SHARE = 0.7
RUN = 3  # tokens a table continuation proposes at most (each one a lookup of the one before it)

_MULT = 0x9E3779B97F4A7C15  # the hash's multiplier (odd, 64-bit)
_MASK = (1 << 64) - 1


def _seed(n: int) -> int:
    return (n * 1000003) & _MASK


def context_hash(tokens: list[int]) -> int:
    """The key of a context (its n tokens, oldest first): the same 64-bit value `build_table` computes."""
    h = _seed(len(tokens))
    for t in tokens:
        h = (h * _MULT + int(t)) & _MASK
    return h


class NgramTable:
    """Sorted keys [E] uint64 and the token each predicts [E] int32, for contexts of `orders` tokens."""

    def __init__(self, keys: np.ndarray, tokens: np.ndarray, orders: tuple[int, ...], meta: dict | None = None):
        self.keys, self.tokens = keys, tokens
        self.orders = tuple(sorted(orders, reverse=True))  # longest first
        self.meta = dict(meta or {})

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def next_token(self, context: list[int]) -> int | None:
        """The token the longest known context ending `context` predicts, or None."""
        wanted = [n for n in self.orders if n <= len(context)]
        if not wanted or not len(self):
            return None
        probes = np.array([context_hash(context[-n:]) for n in wanted], dtype=np.uint64)  # [O]
        where = np.searchsorted(self.keys, probes).clip(max=len(self) - 1)  # [O]
        hits = np.flatnonzero(self.keys[where] == probes)
        return None if not hits.size else int(self.tokens[where[hits[0]]])

    def continuation(self, context: list[int], count: int = RUN) -> list[int]:
        """Up to `count` tokens, each the table's guess after the context and the guesses before it."""
        context, run = list(context[-max(self.orders):]), []
        while len(run) < count:
            token = self.next_token(context)
            if token is None:
                break
            run.append(token)
            context = context[1:] + [token]
        return run


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
        h = np.full(x.shape[0] - n, _seed(n), dtype=np.uint64)  # [T - n]: the context x[t-n : t] of target t
        clean = np.ones(x.shape[0] - n, dtype=bool)
        for j in range(n):
            column = x[j: x.shape[0] - n + j]
            clean &= column >= 0
            h = h * np.uint64(_MULT) + column.astype(np.uint64)  # wraps mod 2^64, as context_hash
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


def write_table(table: NgramTable, folder: str | Path, vocab_size: int) -> Path:
    from safetensors.numpy import save_file

    path = Path(folder) / NGRAMS_FILE
    meta = {"format": FORMAT, "version": VERSION, "orders": ",".join(str(n) for n in sorted(table.orders)),
            "vocab_size": str(vocab_size), **{k: str(v) for k, v in table.meta.items()}}
    save_file({"keys": table.keys.view(np.int64), "tokens": table.tokens}, str(path), metadata=meta)
    return path


def read_table(folder: str | Path, vocab_size: int) -> NgramTable | None:
    """The table beside a draft's weights, or None when there is none; a damaged or mismatched one is refused."""
    from safetensors import SafetensorError, safe_open

    path = Path(folder) / NGRAMS_FILE
    if not path.is_file():
        return None
    fix = (f"rebuild it (`blockdraft ngrams {Path(folder)} --data DATA`), delete it, or load the draft with "
           "--no-ngrams")
    try:
        with safe_open(str(path), "np") as f:  # one read: the metadata and the tensors
            meta = f.metadata() or {}
            arrays = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file ({error}); {fix}") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise CheckpointError(f"{path} is not a blockdraft n-gram table of version {VERSION} (format "
                              f"{meta.get('format')!r}, version {meta.get('version')!r}); {fix}")
    if meta.get("vocab_size") != str(vocab_size):
        raise CheckpointError(f"{path} predicts ids of a {meta.get('vocab_size')}-id vocabulary, the target has "
                              f"{vocab_size}: it belongs to another target; {fix}")
    try:
        orders = tuple(int(n) for n in meta.get("orders", "").split(","))
    except ValueError:
        orders = ()
    keys, tokens = arrays.get("keys"), arrays.get("tokens")
    if (not orders or min(orders) < 1 or keys is None or tokens is None or keys.ndim != 1 or tokens.ndim != 1
            or keys.shape != tokens.shape or keys.dtype != np.int64 or tokens.dtype != np.int32):
        raise CheckpointError(f"{path} must hold `keys` [E] int64, `tokens` [E] int32 and positive `orders`; {fix}")
    keys = keys.view(np.uint64)
    if keys.size and (not bool((keys[1:] > keys[:-1]).all()) or int(tokens.min()) < 0
                      or int(tokens.max()) >= vocab_size):
        raise CheckpointError(f"{path}: keys must be sorted and distinct and tokens in [0, {vocab_size}); {fix}")
    return NgramTable(keys, tokens, orders, {k: v for k, v in meta.items() if k not in ("format", "version")})
