"""One speculative decode step over all live rows (docs/design.md §2), and the prefill that precedes the first.

The step is the same for every kind of proposal (proposers.py): a chain is a tree whose node i hangs under node
i-1, and the target alone proposes an anchor with no guesses.

Shapes: B live rows, N proposal nodes (anchor included), V vocabulary, L*D tapped feature width.
"""

from __future__ import annotations

import torch

from ..model.target import Target, on_span_grid
from .proposers import Proposal
from .selection import Selector
from .pending import Pending
from .state import DecodeState
from ..sampling.tree import accept_path
from .tree import ancestors
from .tree_slots import in_own_block, tree_offsets


def prefill(state: DecodeState, target: Target, proposer, selector: Selector):
    """Run the prompts through the target, pick each row's first new token (the first anchor).

    Each prompt is right-padded to a multiple of SPAN_GRID positions (model/span.py), and prompts of one padded
    width are prefilled together, apart from the others: a row's prefill then has the shapes it has alone, so its
    cache and first token are the same bits in any batch, in bf16 too. The CPU attention kernel's result for a
    prompt depends on the width the forward is padded to (padded to a longer neighbour's width, a row's cache
    parted in the last bits; tests/test_decode.py, docs/design.md §14)."""
    longest = int(state.prompt_lengths.max())
    widths = [on_span_grid(int(n)) for n in state.prompt_lengths]
    first = torch.empty(len(widths), dtype=torch.long, device=state.tokens.device)  # [B]
    features = None
    for width in sorted(set(widths)):
        rows = torch.tensor([b for b, w in enumerate(widths) if w == width], device=state.tokens.device)  # [b]
        ids = torch.nn.functional.pad(state.tokens[rows, :width], (0, width - min(width, state.tokens.shape[1])))
        positions = torch.arange(width, device=ids.device).expand_as(ids)  # padding writes stale slots only
        lengths = state.prompt_lengths[rows]  # [b]
        cache = state.target_cache if len(rows) == len(widths) else target.new_cache(len(rows), width)
        out = target.forward(ids, positions, cache, proposer.tap_layer_ids, logit_rows=(lengths - 1)[:, None],
                             prompt=True, picks_only=selector.params.greedy)
        first[rows] = selector.first_token(out.logits[:, 0], state.row_ids[rows], lengths)
        if cache is not state.target_cache:
            state.target_cache.put_rows(rows, cache, width)
        if out.features is not None:  # [b, width, L*D] -> [B, longest, L*D], the grid's padding left out
            if features is None:
                features = out.features.new_zeros(len(widths), longest, out.features.shape[-1])
            kept = min(width, longest)
            features[rows, :kept] = out.features[:, :kept]
    state.target_cache.crop_to(state.prompt_lengths)
    state.pending = Pending(features, state.prompt_lengths.clone())
    # The first token is the target's own choice, not a speculative step: it is not counted in tau.
    return state.commit(first[:, None], torch.ones_like(first), None)


def step(state: DecodeState, target: Target, proposer, selector: Selector, stats):
    """Propose, verify, accept, roll back; returns [(row_id, new_tokens)] for the caller to stream."""
    # 1. Draft: the proposer's guesses after each row's anchor x[s] (its newest committed token).
    proposal = proposer.propose(state, selector)
    _, s = state.anchors()  # [B]

    # 2. Verify: the target scores every node in one forward. Node i sits at position s + depth_i and sees the
    #    context and its own ancestors (for a chain: the nodes before it); a chain's in slot s + i, a tree's where
    #    its keys have the bits of its one-token step, if the target's blocks can (tree_slots.py).
    B, N = proposal.tokens.shape
    index = torch.arange(N, device=s.device).expand(B, N)  # [B, N]
    is_tree = proposal.parents is not None
    lanes = is_tree and target.tokenwise
    offsets = tree_offsets(proposal.depths, lanes) if is_tree else index  # [B, N]
    ancestry = ancestors(proposal.parents) if is_tree else None  # [B, N, N]
    #    A ragged chain (`widths`) runs only each row's own nodes through the target's products. Greedy picks
    #    need only each node's argmax (`picks_only`: the target's int8 screen where it has one, screen.py).
    out = target.forward(proposal.tokens, s[:, None] + proposal.depths, state.target_cache,
                         proposer.tap_layer_ids, logit_rows=index, slots=s[:, None] + offsets if is_tree else None,
                         block_mask=ancestry, widths=proposal.widths,
                         picks_only=selector.params.greedy)  # logits [B, N, V]

    # 3. Accept: the path of guesses the target agrees with (or, sampling, accepts), then the target's own token
    #    after its deepest node (bonus or replacement) at path slot a.
    kept = in_own_block(s, proposal.depths, offsets, ancestry) if lanes else None  # [B, N]
    path, num_accepted, ok, token = accept(selector, out.logits, proposal, state.row_ids, s, kept)  # [B, P], [B]...
    committed = torch.cat([proposal.tokens.gather(1, path[:, 1:]), token[:, None]], dim=1)  # [B, P]
    committed.scatter_(1, num_accepted[:, None], token[:, None])  # slot a holds the target's token
    events = state.commit(committed, num_accepted + 1, stats, proposal.reach, lookup=proposal.lookup)
    proposer.observe(proposal, ok, num_accepted)

    # 4. Roll back: the accepted path's K/V move to the slots of their positions (a chain's are there already);
    #    the rest lies past the new length. The new anchor is not cached yet.
    P = path.shape[1]
    if is_tree:
        source = s[:, None] + offsets.gather(1, path)  # [B, P] the path's slots
        state.target_cache.move(source, s[:, None] + torch.arange(P, device=path.device))
    state.target_cache.crop_to(s + num_accepted + 1)
    features = out.features
    if features is not None and features.shape[1] > 1:  # the path's tapped features, in depth order [B, P, L*D]
        features = features.gather(1, path[..., None].expand(B, P, features.shape[-1]))
    if proposal.drafted:
        state.pending = Pending(features, num_accepted + 1)
    elif N == 1:  # a plain step: one position a row, joined with the next ones later (pending.py)
        state.pending.add_plain(features)
    else:  # a lookup block: the draft has not taken in the earlier pending positions yet
        state.pending.add(features, num_accepted + 1)
    return events


def accept(selector: Selector, logits: torch.Tensor, proposal: Proposal, row_ids: torch.Tensor, s: torch.Tensor,
           kept: torch.Tensor | None = None):
    """Acceptance of a proposal from the target's logits at its nodes [B, N, V] -> (path [B, P] of node indices by
    depth, num_accepted [B], accepted nodes [B, N] bool or None for a chain, the target's own token [B]).
    `kept` [B, N]: the tree nodes a deterministic acceptance may take (tree_slots.in_own_block).

    A chain is accepted slot by slot (rejection sampling with the draft's q when it sampled, docs/design.md §3);
    a tree by walking it (greedy or coupled: equality with the target's pick; sampling: point-mass tests)."""
    picks = s[:, None] + proposal.depths + 1  # [B, N]: node i's logits pick the token after it
    if proposal.parents is None:
        limits = None if proposal.widths is None else proposal.widths - 1  # [B] each row's own guesses
        num_accepted, token = selector.accept(logits, proposal.q, proposal.tokens[:, 1:], row_ids, picks, limits)
        if proposal.tokens.shape[1] == 1:  # a plain step: the anchor alone
            return num_accepted[:, None], num_accepted, None, token  # path [B, 1] of node 0
        P = int(num_accepted.max()) + 1
        path = torch.minimum(torch.arange(P, device=s.device)[None, :], num_accepted[:, None])  # [B, P]
        return path, num_accepted, None, token
    ok, token = selector.tree_accept(logits, proposal.tree, row_ids, picks, kept)  # [B, N], [B]
    path, num_accepted = accept_path(proposal.tree, ok)
    return path, num_accepted, ok, token

