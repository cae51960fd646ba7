"""Sampling over a token tree with point-mass guesses: the emitted tokens follow p, and a guess is accepted
exactly as often as p puts mass on it."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import chisquare

from blockdraft.sampling.tree import tree_sample, tree_sample_from_uniforms

ALPHA = 0.01
V = 5
ROWS = 20_000
# Anchor 0 with guesses 2 and 0 at depth 1 (nodes 1, 2), and guess 4 under node 1 (node 3).
TOKENS = torch.tensor([[9, 2, 0, 4]])
PARENTS = torch.tensor([[-1, 0, 0, 1]])
P = torch.tensor([[[0.1, 0.2, 0.4, 0.2, 0.1],  # after the anchor
                   [0.3, 0.3, 0.1, 0.1, 0.2],  # after guess 2 (node 1)
                   [0.2, 0.2, 0.2, 0.2, 0.2],  # after guess 0 (node 2)
                   [0.0, 0.5, 0.0, 0.0, 0.5]]],  # after 2, 4 (node 3)
                 dtype=torch.float64)


def _sample(rows=ROWS, seed=0):
    g = torch.Generator().manual_seed(seed)
    B = rows
    ok, final = tree_sample(P.expand(B, -1, -1), TOKENS.expand(B, -1), PARENTS.expand(B, -1), g)
    return ok, final


def first_two_tokens(ok, final):
    """The first two emitted tokens of each row: accepted guesses in depth order, then the final draw."""
    out = []
    for row_ok, token in zip(ok.tolist(), final.tolist()):
        emitted = [TOKENS[0, i].item() for i in range(1, 4) if row_ok[i]] + [token]
        out.append(emitted[:2])
    return out


def test_first_token_follows_p_and_guesses_are_accepted_by_their_mass():
    ok, final = _sample()
    first = np.array([pair[0] for pair in first_two_tokens(ok, final)])
    counts = np.bincount(first, minlength=V)
    assert chisquare(counts, P[0, 0].numpy() * ROWS).pvalue > ALPHA, counts
    # Guess 2 is accepted with p(2) = 0.4, guess 0 with p(0) = 0.1: 0.5 of the rows accept at depth 1.
    accepted = ok[:, 1:3].any(dim=1).double().mean().item()
    assert abs(accepted - 0.5) < 0.015, accepted


def test_second_token_follows_p_at_the_accepted_node():
    ok, final = _sample(seed=1)
    pairs = first_two_tokens(ok, final)
    second = np.array([pair[1] for pair in pairs if pair[0] == 2])  # after guess 2: node 1's distribution
    counts = np.bincount(second, minlength=V)
    assert chisquare(counts, P[0, 1].numpy() * len(second)).pvalue > ALPHA, counts


def test_keeping_a_rejected_guess_fails_the_same_test():
    """Power: drawing the final token from p, rejected guesses included, shifts the first token's law."""
    ok, _ = _sample(seed=2)
    g = torch.Generator().manual_seed(3)
    wrong = torch.multinomial(P[0, 0].float(), ROWS, replacement=True, generator=g)  # the draw ignores rejections
    first = np.array([2 if o[1] else 0 if o[2] else int(w) for o, w in zip(ok.tolist(), wrong.tolist())])
    counts = np.bincount(first, minlength=V)
    assert chisquare(counts, P[0, 0].numpy() * ROWS).pvalue < ALPHA, counts


def test_a_guess_with_all_the_mass_is_always_accepted():
    p = torch.zeros(1, 2, V, dtype=torch.float64)
    p[0, 0, 3] = 1.0
    p[0, 1, 1] = 1.0
    uniforms = torch.full((1, 2), 0.999999)
    ok, final = tree_sample_from_uniforms(p, torch.tensor([[0, 3]]), torch.tensor([[-1, 0]]), uniforms)
    assert ok.tolist() == [[True, True]] and final.tolist() == [1]
