"""Acceptance over a token tree (decode/tree.py builds them): the path the target agrees with, greedy or coupled
(`accepted_nodes`), and exact sampling when its guesses are fixed tokens (point masses, `tree_sample`).

A tree is anything with `tokens`, `parents` and `depths` [B, N] (node 0 the anchor, parents before children).

p is the target's distribution at a node (the token after it), as in accept.py. A node's children c1, c2, ...
(distinct tokens, in tree order) are tried in turn, each as a point-mass proposal q = one-hot(c): c is accepted
with probability r(c), the current residual's mass on it, and a rejection removes it, r <- norm(r with c zeroed)
(the residual norm(max(0, r - q)) of a point mass). So

    P(c_i accepted) = prod_{j<i} (1 - r_{j-1}(c_j)) * r_{i-1}(c_i) = p(c_i),

and when every child is rejected the token drawn from the final residual has probability p(x) for every other
x: the token emitted at a node is an exact draw from p. An accepted child becomes the node and the walk goes on;
a node without children, or whose children are all rejected, ends the walk with that draw (the bonus token, or
the replacement). By induction the committed tokens are distributed as the target's own sampling, whatever
tokens the tree holds; a better tree only accepts more.

Randomness: per row N uniforms in a fixed order, the child tests first (at most N-1: each node is tested at
most once) and the last one for the final draw.

Shapes: B rows, N tree nodes (node 0 the anchor), V vocabulary.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .transforms import Generators, draw_uniforms, sample_from_uniforms


class Tree(Protocol):
    """What acceptance reads of a tree (decode/tree.py builds them): its three tensors, nothing else."""

    tokens: torch.Tensor  # [B, N] node tokens; node 0 is the anchor
    parents: torch.Tensor  # [B, N] parent node index; -1 for the anchor
    depths: torch.Tensor  # [B, N] 0 for the anchor, d for a guess at slot d


def tree_sample_from_uniforms(p: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                              uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Walk each row's tree -> (accepted nodes [B, N] bool, the anchor's included; the final token [B]).

    p [B, N, V]: the target's distribution at every node; tokens, parents [B, N] (parents[:, 0] = -1, a parent
    before its children); uniforms [B, N] in [0, 1).
    """
    B, N, V = p.shape
    if tuple(tokens.shape) != (B, N) or tuple(parents.shape) != (B, N) or tuple(uniforms.shape) != (B, N):
        raise ValueError(f"p [B, N, V] = {list(p.shape)} needs tokens, parents and uniforms of shape [{B}, {N}]; "
                         f"got {list(tokens.shape)}, {list(parents.shape)}, {list(uniforms.shape)}")
    ok = torch.zeros(B, N, dtype=torch.bool)
    ok[:, 0] = True
    final = torch.zeros(B, dtype=torch.long)
    token_rows, parent_rows, u = tokens.tolist(), parents.tolist(), uniforms.tolist()
    for b in range(B):
        children: dict[int, list[int]] = {}
        for node in range(1, N):
            children.setdefault(parent_rows[b][node], []).append(node)
        node, draw = 0, 0
        while True:
            residual = p[b, node].double().clone()  # [V], unnormalised
            accepted = None
            for child in children.get(node, []):
                token = token_rows[b][child]
                total = float(residual.sum())
                mass = float(residual[token]) / total if total > 0 else 0.0
                draw += 1
                if u[b][draw - 1] < mass:
                    accepted = child
                    break
                residual[token] = 0.0
            if accepted is None:
                if not float(residual.sum()) > 0:  # only float rounding can empty it: every token was a child
                    residual = p[b, node].double()
                final[b] = sample_from_uniforms(residual, uniforms[b, N - 1])
                break
            ok[b, accepted] = True
            node = accepted
    return ok.to(tokens.device), final.to(tokens.device)


def tree_sample(p: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, generator: Generators = None):
    """`tree_sample_from_uniforms` with N uniforms per row from `generator` (one per row, or one for all)."""
    B, N = tokens.shape
    return tree_sample_from_uniforms(p, tokens, parents, draw_uniforms(generator, (B, N), p.device))


def accepted_nodes(tree: Tree, target_tokens: torch.Tensor) -> torch.Tensor:
    """[B, N] bool: the nodes on the accepted path, given the target's argmax at every node [B, N]."""
    B, N = tree.tokens.shape
    ok = torch.zeros(B, N, dtype=torch.bool, device=tree.tokens.device)
    ok[:, 0] = True
    rows = torch.arange(B, device=ok.device)
    for i in range(1, N):
        parent = tree.parents[:, i]
        ok[:, i] = ok[rows, parent] & (tree.tokens[:, i] == target_tokens[rows, parent])
    return ok


def accepted_depth(tree: Tree, ok: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """[B]: how many guesses the first `width` nodes (all when None) would have accepted."""
    depth = torch.where(ok, tree.depths, -1)
    return depth[:, :width].amax(dim=1)


def deepest_node(ok: torch.Tensor) -> torch.Tensor:
    """[B]: the deepest accepted node of each row, from ok [B, N] (ancestors come first: the largest index)."""
    index = torch.arange(ok.shape[1], device=ok.device)
    return torch.where(ok, index, -1).argmax(dim=1)


def accept_path(tree: Tree, ok: torch.Tensor):
    """The accepted path from the accepted nodes ok [B, N] (`accepted_nodes`, or a sampled walk) ->
    (path [B, P] node indices by depth, num_accepted [B]).

    Row b's path holds its anchor and accepted nodes in its first num_accepted[b] + 1 entries, then repeats its
    deepest node up to P = max(num_accepted) + 1.
    """
    num_accepted = accepted_depth(tree, ok)  # [B]; at most one accepted node per depth: siblings differ
    deepest = deepest_node(ok)  # [B]
    P = int(num_accepted.max()) + 1
    N = tree.size
    index = torch.arange(N, device=ok.device).expand_as(ok)
    # Path nodes in index order are in depth order (ancestors come first); the rest sort after them.
    order = torch.where(ok, index, index + N).argsort(dim=1)[:, :P]  # [B, P]
    on_path = torch.arange(P, device=ok.device)[None, :] <= num_accepted[:, None]
    path = torch.where(on_path, order, deepest[:, None])
    return path, num_accepted
