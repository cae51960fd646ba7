"""One speculative decode step over all live rows (docs/design.md §2), and the prefill that precedes the first.

Shapes: B live rows, K block size, V vocabulary, L*D tapped feature width.
"""

from __future__ import annotations

import time

import torch

from ..model.target import Target
from .drafter import Drafter
from .lookup import PromptLookup
from .policy import TreeWidth
from .selection import Selector
from .state import DecodeState
from .tree import TOP_K, accept_path, accepted_depth, ancestors, build_grafted_tree, max_nodes


def prefill(state: DecodeState, target: Target, drafter: Drafter | None, selector: Selector, stats, policy=None):
    """Run the prompts through the target, pick each row's first new token (the first anchor)."""
    width = int(state.prompt_lengths.max())
    ids = state.tokens[:, :width]  # [B, P] right-padded prompts
    positions = torch.arange(width, device=ids.device).expand_as(ids)  # padding writes stale slots only
    taps = drafter.tap_layer_ids if drafter else ()
    out = target.forward(ids, positions, state.target_cache, taps, logit_rows=(state.prompt_lengths - 1)[:, None])
    first = selector.first_token(out.logits[:, 0], state.row_ids, state.prompt_lengths)  # [B]
    state.target_cache.crop_to(state.prompt_lengths)
    state.pending, state.pending_counts = out.features, state.prompt_lengths.clone()
    # The first token is the target's own choice, not a speculative step: it is not counted in tau.
    return state.commit(first[:, None], torch.ones_like(first), None)


def step(state: DecodeState, target: Target, drafter: Drafter | None, selector: Selector, stats,
         policy=None, lookup: PromptLookup | None = None, tree: bool = False):
    """Draft (or look up), verify, accept, roll back; returns [(row_id, new_tokens)] for the caller to stream.

    `policy` (see policy.py) picks the verify width w <= K of this step and is told how it went; without one
    every step verifies the full block. `lookup` (lookup.py), when given, may take the step instead: a block
    continued from an earlier occurrence of each row's last tokens, at the width of its own policy. `tree`
    verifies a token tree of w nodes instead of a block of w slots (`tree_step`); a lookup's continuation is
    then grafted onto the tree instead of competing with it.
    """
    started = time.perf_counter()
    anchors, s = state.anchors()  # [B], [B]: newest committed token and its position
    for timed in (policy, lookup.policy if lookup is not None else None):
        if hasattr(timed, "at_batch"):  # step times depend on the batch size: judge by steps of this one
            timed.at_batch(anchors.shape[0])
    if tree and drafter is not None:
        # A tree step grafts the rows' lookup continuations onto the draft's tree: one verify tries both.
        width = policy.choose() if policy is not None else drafter.block_size
        found, graft = graft_runs(state, lookup, policy, width) if lookup is not None else (None, 0)
        if width > 1 or graft > 0:
            return tree_step(state, target, drafter, selector, stats, policy, width, anchors, s, started,
                             lookup, found, graft)
        found, use_lookup, chooser = None, False, policy  # a plain step
    else:
        found = lookup.propose(state.tokens, state.lengths) if lookup is not None and drafter is not None else None
        use_lookup = found is not None and lookup.preferred_over(policy)
        chooser = lookup.policy if use_lookup else policy
        width = 1 if drafter is None else chooser.choose() if chooser is not None else drafter.block_size

    # 1. Draft: feed the newly committed positions to the draft's context cache, then propose the block (the
    #    draft runs all K slots, as trained; the head scores only the w-1 proposals this step verifies). A plain
    #    step (w = 1) leaves the draft alone: its pending positions wait for the next drafted step, fed at once.
    #    So does a lookup step, whose proposals are the looked-up tokens (no longer than the longest match).
    drafted = width > 1 and not use_lookup
    if drafted:
        drafter.append_context(state.pending, state.pending_counts)
        draft_logits = drafter.propose(anchors, s, slots=width - 1)  # [B, w-1, V]
        ahead = s[:, None] + 1 + torch.arange(width - 1, device=s.device)  # [B, w-1]: the proposals' positions
        proposals, draft_probs = selector.propose(draft_logits, anchors, state.row_ids, ahead)  # [B, w-1], [B, w-1, V]
    elif width > 1:
        width = min(width, 1 + int(found[1].max()))
        proposals, draft_probs = selector.point_mass(found[0][:, : width - 1], target.lm_head.weight.shape[0])
        lookup.steps += 1
    else:  # target alone, or a plain step: an empty block, the same path as the exactness oracle
        proposals, draft_probs = selector.propose(None, anchors, state.row_ids)  # [B, 0], None

    # 2. Verify: the target scores [anchor, d1..d(K-1)] at positions s..s+K-1 in one forward.
    block = torch.cat([anchors[:, None], proposals], dim=1)  # [B, K]
    K = block.shape[1]
    positions = s[:, None] + torch.arange(K, device=block.device)  # [B, K]
    taps = drafter.tap_layer_ids if drafter else ()
    rows = torch.arange(K, device=block.device).expand_as(block)
    out = target.forward(block, positions, state.target_cache, taps, logit_rows=rows)  # logits [B, K, V]

    # 3. Accept: a proposals plus the target's own token at slot a (bonus or replacement).
    picks = positions + 1  # [B, K]: slot i's logits pick the token at position s + i + 1
    num_accepted, target_token = selector.accept(out.logits, draft_probs, proposals, state.row_ids, picks)  # [B], [B]
    committed = torch.cat([proposals, target_token[:, None]], dim=1)  # [B, K]
    committed.scatter_(1, num_accepted[:, None], target_token[:, None])  # slot a holds the target's token
    events = state.commit(committed, num_accepted + 1, stats, width, lookup=use_lookup)
    if chooser is not None and drafter is not None:
        chooser.observe(width, num_accepted.tolist(), time.perf_counter() - started)  # commit has synced

    # 4. Roll back: the target keeps x[s] and the accepted proposals; the new anchor is not cached yet.
    state.target_cache.crop_to(s + num_accepted + 1)
    kept = int(num_accepted.max()) + 1
    features = out.features[:, :kept] if out.features is not None else None  # tapped features of slots 0..a
    if drafter is not None and not drafted:  # the draft has not taken in the earlier pending positions yet
        state.pending, state.pending_counts = join_pending(state.pending, state.pending_counts, features,
                                                           num_accepted + 1)
    else:
        state.pending, state.pending_counts = features, num_accepted + 1
    return events


def graft_runs(state: DecodeState, lookup: PromptLookup, policy, width: int):
    """The rows' lookup runs (proposals [B, W-1], lengths [B]; None without a match) and how many of their tokens
    to graft onto a tree of `width` nodes. The runs are looked up only where some graft would pay if every row
    had a full-length run (a lookup over every row's context costs a few percent of a batched plain step)."""
    rows = state.lengths.shape[0]
    if lookup.graft_length(policy, width, lookup.width - 1, rows=rows) == 0:
        lookup.observe_graft(0, [])
        return None, 0
    found = lookup.runs(state.tokens, state.lengths)
    if found is None:
        return None, 0
    graft = lookup.graft_length(policy, width, int(found[1].max()), rows=rows)
    if graft == 0:
        lookup.observe_graft(0, [])
    return found, graft


def tree_step(state: DecodeState, target: Target, drafter: Drafter, selector: Selector, stats, policy, width: int,
              anchors: torch.Tensor, s: torch.Tensor, started: float, lookup: PromptLookup | None = None,
              found: tuple[torch.Tensor, torch.Tensor] | None = None, graft: int = 0):
    """One step over a token tree (tree.py), numbered as `step`; anchors [B] at positions s [B].

    The tree holds the draft's `width` likeliest nodes (none past the anchor when width is 1) and, grafted on, up
    to `graft` tokens of each row's lookup continuation `found` (proposals [B, W-1], lengths [B]; lookup.py).
    """
    B = anchors.shape[0]
    runs = (found[0][:, :graft], found[1].clamp(max=graft)) if graft > 0 else (None, None)

    # 1. Draft: the block's slot distributions, then the `width` likeliest nodes over them, then the runs. A row
    #    of a batch whose run adds fewer nodes is filled with more draft nodes, so a graft drafts every slot.
    drafted = width > 1 or (graft > 0 and B > 1)
    candidates, size = None, 1
    if drafted:
        drafter.append_context(state.pending, state.pending_counts)
        slots = drafter.block_size - 1 if graft > 0 and B > 1 else min(drafter.block_size - 1, width - 1)
        ahead = s[:, None] + 1 + torch.arange(slots, device=s.device)  # [B, n]: the slots' positions

        def score(logits, ids, vocab_size):  # coupled sampling ranks the candidates under their positions' noise
            return selector.draft_scores(logits, ids, vocab_size, ahead, state.row_ids)

        candidates = drafter.propose_top(anchors, s, slots, TOP_K, score)  # scores, tokens [B, n, k]
        size = min(width, max_nodes(slots, TOP_K))
    tree, run_nodes = build_grafted_tree(anchors, candidates, size, *runs)  # run_nodes [B, graft]
    N = tree.size

    # 2. Verify: node i at position s + depth_i, in cache slot s + i, sees the context and its ancestors.
    index = torch.arange(N, device=anchors.device).expand(B, N)  # [B, N]
    out = target.forward(tree.tokens, s[:, None] + tree.depths, state.target_cache, drafter.tap_layer_ids,
                         logit_rows=index, slots=s[:, None] + index, block_mask=ancestors(tree.parents))

    # 3. Accept: the path of nodes the target agrees with (greedy, coupled) or samples (point-mass tests), then the
    #    target's own token after its deepest node.
    picks = s[:, None] + tree.depths + 1  # [B, N]: node i's logits pick the token after it
    ok, bonus = selector.tree_accept(out.logits, tree, state.row_ids, picks)  # [B, N], [B]
    path, num_accepted = accept_path(tree, ok)  # [B, P], [B]
    committed = torch.cat([tree.tokens.gather(1, path[:, 1:]), bonus[:, None]], dim=1)  # [B, P]
    committed.scatter_(1, num_accepted[:, None], bonus[:, None])  # slot a holds the target's token
    deepest = int(tree.depths.max()) + 1  # the slots this tree reached: its width for the per-position rates
    events = state.commit(committed, num_accepted + 1, stats, deepest, lookup=graft > 0)
    seconds = time.perf_counter() - started
    if drafted and hasattr(policy, "observe_cost"):
        policy.observe_cost(N, seconds)
    observe(policy, lookup, tree, ok, size, graft, run_nodes, runs[1], seconds, drafted)

    # 4. Roll back: the accepted path's K/V move to the slots of their positions; the rest lies past the length.
    P = path.shape[1]
    state.target_cache.move(s[:, None] + path, s[:, None] + torch.arange(P, device=path.device))
    state.target_cache.crop_to(s + num_accepted + 1)
    features = out.features
    if features is not None:  # the path's tapped features, in depth order [B, P, L*D]
        features = features.gather(1, path[..., None].expand(B, P, features.shape[-1]))
    if drafted:
        state.pending, state.pending_counts = features, num_accepted + 1
    else:  # the draft has not taken in the earlier pending positions yet
        state.pending, state.pending_counts = join_pending(state.pending, state.pending_counts, features,
                                                           num_accepted + 1)
    return events


def observe(policy, lookup: PromptLookup | None, tree, ok: torch.Tensor, size: int, graft: int,
            run_nodes: torch.Tensor, run_lengths: torch.Tensor | None, seconds: float,
            drafted: bool = True) -> None:
    """Tell each source's policy what its part of a tree step accepted, as if verified alone: the draft's first
    `size` nodes (timed without the grafted nodes' estimated cost) and the grafted runs.

    A run grafted onto a plain step of a batch ran the draft too (to fill rows up): that step tells nothing of
    what a plain step costs, so width 1 is not timed by it."""
    if policy is not None and not (size == 1 and drafted):
        extra = tree.size - size  # nodes the graft added (and, in a batch, the draft nodes that filled rows up)
        cost = policy.seconds_per_position() if extra and hasattr(policy, "seconds_per_position") else None
        seconds_alone = max(seconds - extra * cost, seconds / 2) if cost is not None else seconds
        accepted = accepted_depth(tree, ok, size).tolist()
        # What each narrower tree would have accepted: its first w nodes. Exact when greedy or coupled; under
        # rejection sampling equal in distribution, since a node's children are tried in tree order and a
        # narrower tree holds a prefix of them (sampling/tree.py; test_sampling_tree.py checks the means).
        if isinstance(policy, TreeWidth):
            within = {w: accepted_depth(tree, ok, w).tolist() for w in policy.widths if 1 < w <= size}
            policy.observe(size, accepted, seconds_alone, within=within)
        else:
            policy.observe(size, accepted, seconds_alone)
    if graft > 0:
        on_run = torch.arange(graft, device=ok.device)[None, :] < run_lengths[:, None]  # [B, graft]
        hits = ok.gather(1, run_nodes) & on_run  # a run token is accepted when its node is
        lookup.observe_graft(graft, hits.long().cumprod(dim=1).sum(dim=1).tolist())


def join_pending(old: torch.Tensor, old_counts: torch.Tensor, new: torch.Tensor, new_counts: torch.Tensor):
    """Append row b's first new_counts[b] entries of new [B, Q, F] after its first old_counts[b] entries of
    old [B, P, F] -> ([B, P+Q, F], old_counts + new_counts). Entries past a row's count are padding."""
    if old is None or new is None:  # a drafter that taps no features (a test double): only counts to keep
        return None, old_counts + new_counts
    B, P, F = old.shape
    Q = new.shape[1]
    out = old.new_zeros(B, P + Q, F)
    out[:, :P] = old
    where = old_counts[:, None] + torch.arange(Q, device=old.device)  # [B, Q]: right after each row's entries
    out.scatter_(1, where[..., None].expand(B, Q, F), new.to(old.dtype))
    return out, old_counts + new_counts
