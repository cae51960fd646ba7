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
wrong guess. The file beside a draft's weights is `blockdraft_ngrams.safetensors` (docs/format.md): this module is
the table, its hash and that file; `blockdraft ngrams` builds one (train/ngrams.py), decode/lookup.py reads it.

Shapes: E table entries, L context length.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CheckpointError

NGRAMS_FILE = "blockdraft_ngrams.safetensors"
FORMAT = "blockdraft-ngrams"
VERSION = "1"

RUN = 3  # tokens a table continuation proposes at most (each one a lookup of the one before it)

HASH_MULT = 0x9E3779B97F4A7C15  # the hash's multiplier (odd, 64-bit)
HASH_MASK = (1 << 64) - 1


def hash_seed(n: int) -> int:
    return (n * 1000003) & HASH_MASK


def context_hash(tokens: list[int]) -> int:
    """The key of a context (its n tokens, oldest first): the same 64-bit value `build_table` computes."""
    h = hash_seed(len(tokens))
    for t in tokens:
        h = (h * HASH_MULT + int(t)) & HASH_MASK
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
