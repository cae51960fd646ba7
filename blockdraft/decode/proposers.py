"""Where a step's guesses come from: the target alone, the draft's chain, the draft's token tree, a prompt lookup,
or a lookup run grafted onto the tree. Each proposer returns one `Proposal`; the step (step.py) verifies,
accepts and rolls back every kind the same way, then tells the proposer what was accepted (`observe`), which it
passes on to its width policies (policy.py) and lookup (lookup.py).

Shapes: B live rows, N nodes (anchor included), V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .drafter import Drafter
from .lookup import PromptLookup
from .policy import AdaptiveWidth, TreeWidth, WidthPolicy
from .selection import Selector
from .state import DecodeState
from ..sampling.tree import accepted_depth
from .tree import TOP_K, Tree, build_grafted_tree, max_nodes
from .tree_slots import lane_room


@dataclass
class Proposal:
    """What one step verifies: the anchor (node 0) and the guesses after it, as a tree; a chain is the tree in
    which node i's parent is node i-1 (`parents` None)."""

    tokens: torch.Tensor  # [B, N] node tokens
    depths: torch.Tensor  # [B, N] 0 for the anchor, d for a guess at slot d
    parents: torch.Tensor | None  # [B, N] parent node, -1 for the anchor; None for a chain
    q: torch.Tensor | None  # [B, N-1, V] each chain guess's q (rejection sampling); None when picks are deterministic
    drafted: bool  # whether the draft took in the pending context this step (else it waits for the next)
    reach: int  # the slots this step could reach (its width), for the per-position rates
    lookup: bool = False  # whether looked-up tokens are among the guesses
    widths: torch.Tensor | None = None  # [B] a ragged chain: row b's first widths[b] nodes are real; None: all N

    @property
    def tree(self) -> Tree:
        return Tree(self.tokens, self.parents, self.depths)


def chain(anchors: torch.Tensor, guesses: torch.Tensor, q: torch.Tensor | None, drafted: bool,
          lookup: bool = False) -> Proposal:
    """A chain proposal of anchors [B] and guesses [B, n] -> N = n + 1 nodes."""
    tokens = torch.cat([anchors[:, None], guesses], dim=1)  # [B, N]
    depths = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    return Proposal(tokens, depths, None, q, drafted, tokens.shape[1], lookup)


class Proposer(Protocol):
    """What the decode loop (generate.py, step.py) asks of a proposer, built by `Decoder` for one decode."""

    drafter: Drafter | None  # the draft's runner, whose caches the loop starts, trims and grows; None without one
    block_size: int  # K: the draft's block (1 for the target alone)
    lookahead: int  # the most slots past the anchor's one step may write (the caches keep that much room)
    tap_layer_ids: tuple[int, ...]  # the target layers whose features the draft reads

    def propose(self, state: DecodeState, selector: Selector) -> Proposal: ...

    def observe(self, proposal: Proposal, ok: torch.Tensor | None, num_accepted: torch.Tensor) -> None: ...


def taps_for(drafter: Drafter, policy: WidthPolicy) -> tuple[int, ...]:
    """The target layers a step taps for the draft: none where the policy never drafts (lookup alone)."""
    return () if getattr(policy, "plain_only", False) else drafter.tap_layer_ids


class TargetAlone:
    """No guesses: every step is the target's own one-token step (the exactness oracle and speed baseline)."""

    drafter = None
    block_size = 1
    lookahead = 1
    tap_layer_ids: tuple[int, ...] = ()

    def propose(self, state: DecodeState, selector: Selector) -> Proposal:
        anchors, _ = state.anchors()
        return chain(anchors, anchors.new_zeros(anchors.shape[0], 0), None, drafted=False)

    def observe(self, proposal: Proposal, ok: torch.Tensor | None, num_accepted: torch.Tensor) -> None:
        pass


class ChainProposer:
    """The draft's block of w-1 guesses, one per slot, or, with a `lookup`, a looked-up block instead when that
    is expected to commit tokens faster."""

    def __init__(self, drafter: Drafter, policy: WidthPolicy, lookup: PromptLookup | None = None,
                 vocab_size: int = 0) -> None:
        self.drafter, self.policy, self.lookup = drafter, policy, lookup
        self.tap_layer_ids = taps_for(drafter, policy)
        self.block_size = drafter.block_size
        self.lookahead = max(self.block_size, lookup.width if lookup is not None else 0)
        self.vocab_size = vocab_size  # the target's: a looked-up guess's q is one-hot over it
        self.chooser = policy  # the policy whose choice the last proposal was

    def propose(self, state: DecodeState, selector: Selector) -> Proposal:
        anchors, s = state.anchors()  # [B], [B]
        for policy in (self.policy, *(self.lookup.policies() if self.lookup is not None else ())):
            policy.at_batch(anchors.shape[0])
        found = self.lookup.propose(state.tokens, state.lengths) if self.lookup is not None else None
        looked = found is not None and self.lookup.preferred_over(self.policy)
        self.chooser = self.lookup.current if looked else self.policy
        width = self.chooser.choose()
        if width == 1:  # a plain step: the draft's pending positions wait for the next drafted step
            return chain(anchors, anchors.new_zeros(anchors.shape[0], 0), None, drafted=False)
        if looked:  # no longer than the longest match; the draft is not run
            width = min(width, 1 + int(found[1].max()))
            guesses, q = selector.point_mass(found[0][:, : width - 1], self.vocab_size)
            self.lookup.steps += 1
            return chain(anchors, guesses, q, drafted=False, lookup=True)
        # The draft runs all K slots, as trained; the head scores only the w-1 guesses this step verifies.
        self.drafter.append_context(state.pending.features, state.pending.counts)
        logits = self.drafter.propose(anchors, s, slots=width - 1)  # [B, w-1, V]
        ahead = s[:, None] + 1 + torch.arange(width - 1, device=s.device)  # [B, w-1]: the guesses' positions
        guesses, q = selector.propose(logits, anchors, state.row_ids, ahead)  # [B, w-1], [B, w-1, V] or None
        return chain(anchors, guesses, q, drafted=True)

    def observe(self, proposal: Proposal, ok: torch.Tensor | None, num_accepted: torch.Tensor) -> None:
        self.chooser.observe(proposal.tokens.shape[1], num_accepted.tolist())


class TreeProposer:
    """The draft's `width` likeliest nodes as a token tree (tree.py), with, given a `lookup`, each row's looked-up
    run grafted on as one more path from the anchor when it pays: one verify tries both. Runs grafted onto a
    plain step (the policy's width 1) make a ragged chain instead: each row verifies its own run, without the
    draft, and a row without one its anchor alone."""

    def __init__(self, drafter: Drafter, policy: WidthPolicy, lookup: PromptLookup | None = None,
                 vocab_size: int = 0) -> None:
        self.drafter, self.policy, self.lookup = drafter, policy, lookup
        self.vocab_size = vocab_size  # the target's: a looked-up guess's q is one-hot over it
        self.tap_layer_ids = taps_for(drafter, policy)
        self.block_size = drafter.block_size
        # Up to 2K nodes, and a lookup run grafted onto them, in the slots their lanes take (tree_slots.py).
        self.lookahead = lane_room(2 * self.block_size + (lookup.width if lookup is not None else 0))
        self.size, self.graft, self.runs, self.run_nodes = 1, 0, (None, None), None  # the last tree's parts

    def propose(self, state: DecodeState, selector: Selector) -> Proposal:
        anchors, s = state.anchors()  # [B], [B]
        B = anchors.shape[0]
        for policy in (self.policy, *(self.lookup.policies() if self.lookup is not None else ())):
            policy.at_batch(B)
        width = self.policy.choose()
        found, graft, width = self._graft_runs(state, width) if self.lookup is not None else (None, 0, width)
        self.size, self.graft = 1, graft
        if width == 1 and graft == 0:  # a plain step
            return chain(anchors, anchors.new_zeros(B, 0), None, drafted=False)
        self.runs = (found[0][:, :graft], found[1].clamp(max=graft)) if graft > 0 else (None, None)
        if width == 1:  # runs onto a plain step: a ragged chain of each row's own run, the draft not run
            guesses, q = selector.point_mass(self.runs[0], self.vocab_size)  # [B, graft], [B, graft, V] or None
            proposal = chain(anchors, guesses, q, drafted=False, lookup=True)
            proposal.widths = 1 + self.runs[1]  # [B]
            return proposal
        # The draft's slot distributions, then the likeliest nodes over them, then the runs. A row of a batch whose
        # run adds fewer nodes is filled up with more draft nodes (tree.py).
        self.drafter.append_context(state.pending.features, state.pending.counts)
        K = self.drafter.block_size
        slots = K - 1 if graft > 0 and B > 1 else min(K - 1, width - 1)
        ahead = s[:, None] + 1 + torch.arange(slots, device=s.device)  # [B, n]: the slots' positions

        def score(logits, ids, vocab_size):  # coupled sampling ranks the candidates under their positions' noise
            return selector.draft_scores(logits, ids, vocab_size, ahead, state.row_ids)

        candidates = self.drafter.propose_top(anchors, s, slots, TOP_K, score)  # scores, tokens [B, n, k]
        self.size = min(width, max_nodes(slots, TOP_K))
        tree, self.run_nodes = build_grafted_tree(anchors, candidates, self.size, *self.runs)  # run_nodes [B, graft]
        reach = int(tree.depths.max()) + 1  # the slots this tree reached
        return Proposal(tree.tokens, tree.depths, tree.parents, None, True, reach, lookup=graft > 0)

    def _graft_runs(self, state: DecodeState, width: int):
        """The rows' lookup runs (guesses [B, W-1], lengths [B]; None without a match), how many of their tokens
        to graft, and the width of the step: the policy's `width`, or 1 (the runs on a plain step, a ragged
        chain, no draft) where that is expected to commit tokens faster than the tree with its best graft. The
        runs are looked up only where some graft would pay if every row had a full-length run (a lookup over
        every row's context costs a few percent of a batched plain step), and less often after searches that
        grafted nothing (`PromptLookup.searched`)."""
        lookup, rows = self.lookup, state.lengths.shape[0]
        may = lookup.may_graft(self.policy, width, rows=rows) or (
            width > 1 and lookup.may_graft(self.policy, 1, rows=rows))
        if not may or not lookup.may_search():
            lookup.observe_graft(0, [])
            return None, 0, width
        found = lookup.runs(state.tokens, state.lengths)
        if found is None:
            lookup.searched(False, rows)
            return None, 0, width
        if width > 1 and self._ragged_first(found, width, rows):
            width = 1
        if width == 1:  # a ragged chain: each row's own length
            lengths = lookup.ragged_lengths(self.policy, found[1].tolist(), rows)
            found, graft = (found[0], torch.tensor(lengths, device=found[1].device)), max(lengths)
        else:
            graft = lookup.graft_length(self.policy, width, int(found[1].max()), rows=rows, runs=found[1].tolist())
        lookup.searched(graft > 0, rows)
        if graft == 0:
            lookup.observe_graft(0, [])
        return found, graft, width

    def _ragged_first(self, found, width: int, rows: int) -> bool:
        """Whether the runs `found` on a plain step (a ragged chain, no draft) are expected to commit tokens
        faster than the policy's tree of `width` nodes with its best graft. Not on the policy's opening or
        re-try steps, which are there to measure the draft. At q4 on a CPU a ragged step of HumanEval's runs
        returned 1.83 plain steps' rate and a drafted tree 1.16 (benchmarks/step_truth.py): a tree chosen
        over the draft's plain steps alone displaced the lookup's steps, 5 % slower in all."""
        policy = self.policy
        if not isinstance(policy, AdaptiveWidth) or policy.steps < policy.opening or \
                policy.last_explored == policy.steps:
            return False
        lengths, ragged = self.lookup.ragged_plan(policy, found[1].tolist(), rows)
        if not any(lengths):
            return False
        return ragged > self.lookup.graft_rate(policy, width, int(found[1].max()), rows)

    def observe(self, proposal: Proposal, ok: torch.Tensor | None, num_accepted: torch.Tensor) -> None:
        """Tell each source's policy what its part of the step accepted, as if verified alone: the draft's first
        `size` nodes, and the grafted runs. A run grafted onto a plain step of a wide batch ran the draft too (to
        fill rows up), which tells nothing of the draft's own nodes."""
        if proposal.parents is None:  # a plain step, or runs in a ragged chain
            self.policy.observe(1, [0] * len(num_accepted))
            if proposal.widths is not None:
                self.lookup.observe_graft(self.graft, num_accepted.tolist(), self.runs[1].tolist(), by_row=True)
            return
        tree = proposal.tree
        if not (self.size == 1 and proposal.drafted):
            accepted = accepted_depth(tree, ok, self.size).tolist()
            # What each narrower tree would have accepted: its first w nodes. Exact when greedy or coupled; under
            # rejection sampling equal in distribution, since a node's children are tried in tree order and a
            # narrower tree holds a prefix of them (sampling/tree.py; test_sampling_tree.py checks the means).
            within = None
            if isinstance(self.policy, TreeWidth):
                within = {w: accepted_depth(tree, ok, w).tolist() for w in self.policy.widths if 1 < w <= self.size}
            self.policy.observe(self.size, accepted, within=within)
        if self.graft > 0:
            lengths = self.runs[1]
            on_run = torch.arange(self.graft, device=ok.device)[None, :] < lengths[:, None]  # [B, graft]
            hits = ok.gather(1, self.run_nodes) & on_run  # a run token is accepted when its node is
            self.lookup.observe_graft(self.graft, hits.long().cumprod(dim=1).sum(dim=1).tolist(), lengths.tolist())
