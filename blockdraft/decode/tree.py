"""Token trees: several guesses per slot, verified in one target forward.

The draft scores every slot of its block at once, so beside its first choice for each slot it offers
runners-up. A tree spends the verify width on the likeliest of them. Terms:

- node 0 is the anchor (depth 0); every other node is one token at depth d, a guess for slot d, whose parent
  is a node at depth d-1. Siblings hold different tokens.
- the target verifies all N nodes in one forward: node i sits at position s + depth_i, in the cache slot
  tree_slots.py gives it, and attends to the committed context and to its own ancestors only (`ancestors`).
- acceptance (sampling/tree.py): greedy, a node is accepted when its token is the target's argmax at its
  parent and its parent is accepted, so the accepted nodes form one path from the anchor and every kept token
  is one the target would have produced itself; sampling, the children of a node are tried in turn as
  point-mass proposals, which keeps the output distributed exactly as the target's own sampling.

Nodes are chosen best-first by the draft's path probability, the product of q_d(token) over the path (q_d:
the draft's distribution for slot d; DFlash drafts all slots in parallel, so q_d does not depend on the
guesses before it). Best-first order makes the first w nodes of a tree the tree of w nodes: a parent always
comes before its children, and one step of width W tells what every width w <= W would have accepted. The
draft's own log-probs rank best: tempered (/0.7, /1.5) or with a bonus per depth (+-0.3), trees of 8 nodes
accepted less on HumanEval (benchmarks/results/2026-12-06-stage19/).

Shapes: B rows, N nodes (anchor included), n draft slots, k candidates per slot, V vocabulary.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

# Candidates per slot. Over the target's greedy answers to 8 HumanEval and 8 MT-Bench prompts (128 tokens, every
# answer position an anchor, the shipped draft), a best-first tree of 16 nodes held 2.5-3 % more accepted tokens
# per step (bonus counted) with 8 candidates than with 4, 0.9-1.4 % at 8 nodes; 6 gave about half of that gain.
TOP_K = 8


@dataclass
class Tree:
    tokens: torch.Tensor  # [B, N] node tokens; node 0 is the anchor
    parents: torch.Tensor  # [B, N] parent node index; -1 for the anchor
    depths: torch.Tensor  # [B, N] 0 for the anchor, d for a guess at slot d

    @property
    def size(self) -> int:
        return self.tokens.shape[1]


def max_nodes(slots: int, top_k: int) -> int:
    """The most nodes a tree over `slots` slots with `top_k` candidates each can hold, anchor included."""
    return 1 + sum(top_k**d for d in range(1, slots + 1))


def build_tree(anchors: torch.Tensor, log_q: torch.Tensor, size: int, top_k: int = TOP_K) -> Tree:
    """The `size` likeliest nodes (anchor included) from anchors [B] and draft log-probs log_q [B, n, V].

    Each slot contributes its top_k tokens; a node's score is the sum of its path's log-probs.
    """
    return build_grafted_tree(anchors, top_candidates(log_q, top_k), size)[0]


def top_candidates(log_q: torch.Tensor, top_k: int = TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """Each slot's top_k candidates from draft log-probs log_q [B, n, V]: (log-probs, tokens), [B, n, k] each,
    best first."""
    top = log_q.topk(min(top_k, log_q.shape[-1]), dim=-1)
    return top.values, top.indices


def build_grafted_tree(anchors: torch.Tensor, candidates: tuple[torch.Tensor, torch.Tensor], size: int,
                       runs: torch.Tensor | None = None, run_lengths: torch.Tensor | None = None):
    """The `size` likeliest nodes over each slot's candidates (log-probs, tokens [B, n, k], best first;
    `top_candidates`), then each row's run of fixed guesses grafted on as a path from the anchor ->
    (tree, run_nodes [B, m]: the node holding each run token).

    runs [B, m] with run_lengths [B] (a prompt lookup's continuation, lookup.py) walk down from the anchor: a
    run token that is already a child of the current node reuses it, any other becomes a new node. Grafted nodes
    come after the `size` best-first nodes, so those stay the tree of `size` nodes; rows whose runs added fewer
    nodes are then filled up to the same node count with the draft's next likeliest nodes. Entries of run_nodes
    past a row's run length are 0 (the anchor). Runs onto a plain step, without the draft, are no tree: a ragged
    chain (proposers.py).
    """
    B = anchors.shape[0]
    n, k = tuple(candidates[1].shape[1:])
    if not 1 <= size <= max_nodes(n, k):
        raise ValueError(f"a tree over {n} slots with {k} candidates each holds 1..{max_nodes(n, k)} nodes, "
                         f"asked for {size}")
    scores, tokens = candidates[0].tolist(), candidates[1].tolist()
    rows = [_RowTree(int(a), score, token, k) for a, score, token in zip(anchors.tolist(), scores, tokens)]
    m = 0 if runs is None else runs.shape[1]
    run_nodes = torch.zeros(B, m, dtype=torch.long)
    run_rows = runs.tolist() if runs is not None else [[] for _ in rows]
    lengths = run_lengths.tolist() if run_lengths is not None else [0] * B
    for b, row in enumerate(rows):
        row.grow(size)
        grafted = row.graft(run_rows[b][: lengths[b]])
        run_nodes[b, : len(grafted)] = torch.tensor(grafted, dtype=torch.long)
    total = max(len(row.tokens) for row in rows)
    for row in rows:
        row.grow(total)
        if len(row.tokens) < total:
            raise ValueError(f"the draft's {n} slots of {k} candidates cannot fill a row to {total} nodes; "
                             "propose more slots when grafting runs onto a batch")
    device = anchors.device
    tree = Tree(*(torch.tensor([getattr(row, name) for row in rows], device=device)
                  for name in ("tokens", "parents", "depths")))
    return tree, run_nodes.to(device)


class _RowTree:
    """One row's tree under construction: best-first over the draft's candidates, plus grafted runs."""

    def __init__(self, anchor: int, scores: list[list[float]], tokens: list[list[int]], k: int) -> None:
        self.scores, self.candidates, self.k = scores, tokens, k
        self.tokens, self.parents, self.depths = [anchor], [-1], [0]
        self.children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        # Heap of (-path score, order, depth, rank, parent node); `order` breaks ties first come, first served.
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.order = 0
        self._push_children(0, 0.0, 0)

    def _push_children(self, node: int, neg: float, depth: int) -> None:
        if depth < len(self.scores):  # the next slot's candidates, after this node
            for r in range(self.k):
                heapq.heappush(self.heap, (neg - self.scores[depth][r], self.order, depth + 1, r, node))
                self.order += 1

    def _add(self, token: int, parent: int) -> int:
        node = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children[(parent, token)] = node
        return node

    def grow(self, size: int) -> None:
        """Add the draft's likeliest remaining nodes until the row holds `size` (or the candidates run out)."""
        while len(self.tokens) < size and self.heap:
            neg, _, depth, rank, parent = heapq.heappop(self.heap)
            token = self.candidates[depth - 1][rank]
            node = self.children.get((parent, token))  # a grafted node the draft also guessed: extend it
            if node is None:
                node = self._add(token, parent)
            self._push_children(node, neg, depth)

    def graft(self, run: list[int]) -> list[int]:
        """Walk `run` down from the anchor, adding the nodes that are missing; the node of each run token."""
        node, path = 0, []
        for token in run:
            child = self.children.get((node, token))
            node = self._add(token, node) if child is None else child
            path.append(node)
        return path


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """[B, N, N] bool: entry (i, j) is True when node j is node i or one of its ancestors."""
    B, N = parents.shape
    eye = torch.eye(N, dtype=torch.bool, device=parents.device)
    out = eye.expand(B, N, N).clone()
    rows = torch.arange(B, device=parents.device)
    for i in range(1, N):  # parents come first, so their rows are complete
        out[:, i] |= out[rows, parents[:, i]]
    return out
