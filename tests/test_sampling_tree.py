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


def test_a_wide_trees_first_w_nodes_accept_as_the_tree_of_w_nodes_does():
    """The width policy reads what a narrower tree would have accepted off a wider tree's walk (its first w nodes):
    under sampling that holds in distribution, since each node tries its children in tree order and a narrower
    tree holds a prefix of them. Mean accepted depths of the two agree for every w; reading the whole wide tree
    instead (a wrong estimate) does not."""
    from blockdraft.decode.tree import Tree
    from blockdraft.sampling.tree import accepted_depth

    # Anchor 0; depth 1: nodes 1, 2, 4 (guesses 2, 0, 3); node 3 (guess 4) under node 1; node 5 (guess 1) under 3.
    tokens = torch.tensor([[9, 2, 0, 4, 3, 1]])
    parents = torch.tensor([[-1, 0, 0, 1, 0, 3]])
    depths = torch.tensor([[0, 1, 1, 2, 1, 3]])
    p = torch.tensor([[[0.1, 0.2, 0.4, 0.2, 0.1], [0.3, 0.3, 0.1, 0.1, 0.2], [0.2, 0.2, 0.2, 0.2, 0.2],
                       [0.1, 0.5, 0.0, 0.0, 0.4], [0.2, 0.2, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2, 0.2, 0.2]]],
                     dtype=torch.float64)
    B, N = 8000, tokens.shape[1]

    def walk(n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        ok, _ = tree_sample(p[:, :n].expand(B, -1, -1), tokens[:, :n].expand(B, -1), parents[:, :n].expand(B, -1), g)
        return ok, Tree(tokens[:, :n].expand(B, -1), parents[:, :n].expand(B, -1), depths[:, :n].expand(B, -1))

    ok, tree = walk(N, seed=1)
    for w in range(2, N):
        read = accepted_depth(tree, ok, w).double()  # [B]
        narrow_ok, narrow = walk(w, seed=100 + w)
        direct = accepted_depth(narrow, narrow_ok).double()
        error = 4 * float((read.var() / B + direct.var() / B).sqrt())
        assert abs(float(read.mean() - direct.mean())) < error, (
            f"the first {w} nodes of a wide tree accept {float(read.mean()):.3f} deep on average, a tree of {w} "
            f"nodes {float(direct.mean()):.3f}: the width policy would learn a biased acceptance")
    whole = accepted_depth(tree, ok).double()
    narrow_ok, narrow = walk(3, seed=7)
    assert abs(float(whole.mean() - accepted_depth(narrow, narrow_ok).double().mean())) > 0.05, "the test has no power"
