"""Where a token tree's nodes sit in the target's cache during their verify forward (docs/design.md §14).

A one-token step at position p sums its keys 0..p in the CPU attention kernel's vector lanes (SPAN_GRID keys
wide, key j in lane j mod SPAN_GRID, a lane's keys in order) and in blocks of ATTENTION_BLOCK keys (a running
softmax across blocks). A tree node at depth d stands for the step at position s + d (s: the anchor's slot); its
keys are the context and its ancestors, with every other node masked out: masked keys add exact zeros. So the
node has its step's bits where each of its ancestors (itself included) lies in the lane and block of its own
position, in the order of their depths: slots s + i in node order (best-first) put a node after a sibling in
the lane of the next depth, and an int4 SmolLM2 verify parted from its steps in about 1 node in 30 (on an AMD
EPYC Zen 5, its blocks already attending token by token: model/layers.tokenwise_sdpa).

Here the nodes of each lane take its slots in order of (depth, node index): the m-th node in lane l sits at
offset l + SPAN_GRID * m from the anchor; a chain keeps offsets 0..N-1. This only where blocks keep their steps'
bits (an int4 or bf16 target on a CPU: Target.tokenwise); elsewhere rows part anyway, nodes keep node order. A node
whose offset leaves the attention block of its position (near a multiple of ATTENTION_BLOCK) is not one its step
would compute: a deterministic acceptance never takes it or its subtree (`in_own_block`), and its token, if
right, comes as the target's own.

Shapes: B rows, N nodes (anchor included).
"""

from __future__ import annotations

import torch

from ..model.span import SPAN_GRID

# Keys the CPU attention kernel (torch's flash attention) takes per block of its running softmax.
ATTENTION_BLOCK = 512


def tree_offsets(depths: torch.Tensor, lanes: bool) -> torch.Tensor:
    """Each node's cache slot past the anchor's [B, N]: its lane's (`lane_offsets`) where the target's blocks keep
    their steps' bits (Target.tokenwise), else node order (no masked rows between lanes to attend over)."""
    if lanes:
        return lane_offsets(depths)
    return torch.arange(depths.shape[1], device=depths.device).expand_as(depths)


def lane_offsets(depths: torch.Tensor) -> torch.Tensor:
    """Each node's cache slot past the anchor's, [B, N], from depths [B, N] (node order: parents first)."""
    B, N = depths.shape
    lane = depths % SPAN_GRID  # [B, N]
    order = depths * N + torch.arange(N, device=depths.device)  # [B, N] rank by (depth, node index)
    before = (lane[:, None, :] == lane[:, :, None]) & (order[:, None, :] < order[:, :, None])  # [B, N, N] j before i
    return lane + SPAN_GRID * before.sum(-1)


def lane_room(nodes: int) -> int:
    """The most slots past the anchor's that a tree of `nodes` nodes takes (its largest offset + 1)."""
    return nodes if nodes <= 2 else 2 + SPAN_GRID * (nodes - 2)


def in_own_block(anchor_slots: torch.Tensor, depths: torch.Tensor, offsets: torch.Tensor,
                 ancestry: torch.Tensor) -> torch.Tensor:
    """[B, N] bool: whether a node and all its ancestors sit in the attention block of their own positions.

    anchor_slots [B]; depths, offsets [B, N]; ancestry [B, N, N] (tree.ancestors: j is i or above it)."""
    s = anchor_slots[:, None]
    own = (s + depths) // ATTENTION_BLOCK == (s + offsets) // ATTENTION_BLOCK  # [B, N]
    return ~(ancestry & ~own[:, None, :]).any(-1)
