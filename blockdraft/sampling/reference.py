"""Slow, loop-by-loop versions of `accept.py` and the inverse-CDF draw, for tests only.

Each works on Python floats one row and one slot at a time, in the order the algorithm is written in
docs/design.md §3, so it can be read against the spec line by line. Tests check the fast tensor code against these
on the same uniforms. Notation and tensor layout as in `accept.py`.
"""

from __future__ import annotations

import torch


def sample_from_uniform(weights: list[float], u: float) -> int:
    """The first token whose running weight exceeds u * total; zero-weight tokens are never chosen."""
    total = 0.0
    for w in weights:
        total += w
    running = 0.0
    for token, w in enumerate(weights):
        running += w
        if running > u * total:
            return token
    # u * total rounded up to total: the last token with weight.
    return max(i for i, w in enumerate(weights) if w > 0)


def residual(p: list[float], q: list[float]) -> list[float]:
    """norm(max(0, p - q)), or p itself when nothing is left (p == q: no rejection can happen)."""
    excess = [max(0.0, pi - qi) for pi, qi in zip(p, q)]
    mass = sum(excess)
    if mass == 0.0:
        return list(p)
    return [e / mass for e in excess]


def greedy_accept_length(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """Per row: count proposals d_(j+1) equal to the target's argmax at slot j until the first miss."""
    # [B, K-1], [B, K] -> [B]
    counts = []
    for draft_row, target_row in zip(draft_tokens.tolist(), target_tokens.tolist()):
        a = 0
        while a < len(draft_row) and draft_row[a] == target_row[a]:
            a += 1
        counts.append(a)
    return torch.tensor(counts, dtype=torch.long)


def speculative_sample(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, uniforms: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row by row: test each proposal, stop at the first rejection, draw the replacement or the bonus."""
    # [B, K, V], [B, K-1, V], [B, K-1], [B, K] -> [B], [B]
    counts, bonus_tokens = [], []
    for p_row, q_row, d_row, u_row in zip(p.tolist(), q.tolist(), draft_tokens.tolist(), uniforms.tolist()):
        K = len(p_row)
        a = 0
        for j in range(1, K):  # proposal d_j, judged by p_(j-1) against q_j
            d = d_row[j - 1]
            p_d, q_d = p_row[j - 1][d], q_row[j - 1][d]
            if q_d > 0:
                ratio = p_d / q_d
            else:
                ratio = float("inf") if p_d > 0 else 0.0
            if not u_row[j - 1] < min(1.0, ratio):
                break
            a += 1
        if a == K - 1:
            dist = p_row[K - 1]  # every proposal accepted: the bonus comes from the last verify slot
        else:
            dist = residual(p_row[a], q_row[a])  # d_(a+1) rejected: replace it
        counts.append(a)
        bonus_tokens.append(sample_from_uniform(dist, u_row[K - 1]))
    return torch.tensor(counts, dtype=torch.long), torch.tensor(bonus_tokens, dtype=torch.long)
