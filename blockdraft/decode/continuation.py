"""Where a row's context continues: the earlier occurrence of its end that shares the longest suffix with it, the
tokens that followed (a prompt-lookup run), and how strong that match is (lookup.py prices runs by it).

Shapes: B rows, C token capacity.
"""

from __future__ import annotations

import numpy as np
import torch


MAX_NGRAM = 16  # how far back a shared suffix ranks occurrences (below: measured gains stopped by 12-16)


def continuation(ids: torch.Tensor, count: int, max_ngram: int = MAX_NGRAM, min_ngram: int = 2) -> torch.Tensor:
    """Up to `count` tokens [m] that followed the earlier occurrence of the context's end that shares the longest
    suffix with it (at least min_ngram, at most max_ngram tokens; the most recent among equals), in ids [L],
    or an empty tensor.

    Ranking occurrences by the shared suffix, not only by the last few tokens, picks the right one of several
    repeats. From the same matches, a suffix of up to 16 tokens instead of 3 made the continuations agree with the
    target's own answers for 19 % more tokens on 60 training answers of `codeio-functions` and 3 % more on 60
    of ShareGPT/HealthBench (every other position); on the first 8 greedy answers of HumanEval, IFEval and
    MT-Bench, 24-35 % more. Longer suffixes than 12-16 changed nothing there.
    """
    start, _ = continuation_start(ids.cpu().numpy(), max_ngram, min_ngram)
    return ids[:0] if start is None else ids[start : start + count]


def continuation_start(x: np.ndarray, max_ngram: int, min_ngram: int) -> tuple[int | None, int]:
    """Where `continuation`'s tokens begin in x [L] (the index after the chosen occurrence), or None, and the
    suffix that occurrence shares with the context's end (0 without one). NumPy: a lookup runs every step, and a
    NumPy op costs a fraction of a torch op's call."""
    L = x.shape[0]
    if L <= min_ngram:
        return None, 0
    starts = L - min_ngram  # windows x[i : i + min_ngram], i < starts, end before the context's last token
    match = x[:starts] == x[starts]
    for j in range(1, min_ngram):
        match &= x[j : starts + j] == x[starts + j]
    ends = np.flatnonzero(match) + (min_ngram - 1)  # [S] last index of each occurrence
    if not ends.size:
        return None, 0
    # Suffix shared with the context's end: compare backwards from each occurrence's end, up to max_ngram.
    back = np.arange(min(max_ngram, L))  # [n]
    here = ends[:, None] - back  # [S, n] positions before each occurrence's end
    same = (here >= 0) & (x[np.maximum(here, 0)] == x[L - 1 - back])  # [S, n]
    shared = np.cumprod(same, axis=1).sum(axis=1)  # [S], >= min_ngram
    best = int(np.argmax(shared * L + ends))  # the longest, then the most recent
    return int(ends[best]) + 1, int(shared[best])


def lookup_block(tokens: torch.Tensor, lengths: torch.Tensor, count: int, max_ngram: int = MAX_NGRAM,
                 min_ngram: int = 2, shared: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's continuation of its first lengths[b] tokens of tokens [B, C]: proposals [B, count] (padded
    by repeating the row's last proposal) and their real lengths [B] (0: no match, the row is all padding); None
    when no row has a match. `shared`, a list, receives each row's shared suffix (0: no match)."""
    rows, lengths_cpu = tokens.cpu().numpy(), lengths.cpu().tolist()
    out = np.zeros((rows.shape[0], count), dtype=np.int64)
    found = np.zeros(rows.shape[0], dtype=np.int64)
    for b, length in enumerate(lengths_cpu):
        start, suffix = continuation_start(rows[b, :length], max_ngram, min_ngram)
        if shared is not None:
            shared.append(suffix if start is not None else 0)
        if start is not None:
            run = rows[b, start : min(start + count, length)]
            out[b, : run.size] = run
            out[b, run.size:] = run[-1]
            found[b] = run.size
    if not found.any():
        return None
    return torch.from_numpy(out).to(tokens.device), torch.from_numpy(found).to(tokens.device)


# A prompt run's class, by the suffix its occurrence shares with the row's end: 2-3, 4-7, 8 or more tokens. Over the
# target's own greedy answers (16 HumanEval and 16 MT-Bench prompts, 128 tokens, q4), a run's first token was the
# target's next one for 35-44 % of the runs sharing 2 tokens, 55-61 % at 3, 66-82 % at 4, 72-85 % at 5-7 and 95 %
# at 8 or more (mean accepted run 1.8-2.0 tokens at 2, 6.4-9.2 at 8+): each class's acceptance is learnt apart.
STRENGTHS = (2, 4, 8)
# Each class's record starts from those rates (AdaptiveWidth's `prior`: slot 1's acceptance, and slot 2's): a run
# whose first token was right went on for 4.6-9.7 tokens on average in every class, about 0.8-0.9 a slot after the
# first. From an even prior the strongest runs, right 95 % of the time, were rarely verified often enough to learn it.
STRENGTH_PRIORS = ((0.45, 0.8), (0.75, 0.85), (0.95, 0.85))


def strength_class(shared: int) -> int:
    """The index into STRENGTHS of a run whose occurrence shares `shared` tokens with the context's end."""
    return max(i for i, least in enumerate(STRENGTHS) if shared >= least or i == 0)
