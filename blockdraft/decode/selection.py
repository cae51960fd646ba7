"""Turning logits into tokens inside the decode loop: greedy argmax or exact rejection sampling.

The selector is the only place where the decode loop meets the sampling math; the math itself lives in
`blockdraft.sampling` as pure functions, and the one logits -> probs transform runs identically on the
target's logits (p) and the draft's (q). Each caller row owns one torch.Generator, so a row draws the
same numbers whatever batch it shares and whichever rows finish before it.

Shapes: B live rows, K block size, V vocabulary.
"""

from __future__ import annotations

import secrets

import torch

from ..errors import InputError
from ..sampling import SamplingParams, greedy_step, logits_to_probs, sample, speculative_sample
from ..sampling.tree import tree_sample
from .tree import Tree, accepted_nodes, deepest_node


class Selector:
    """Greedy (temperature 0) or sampled selection for rows identified by the caller's row ids.

    `draft_argmax=True` proposes the draft's argmax instead of sampling from q; acceptance then uses the
    one-hot q, which is still exact (DESIGN.md §3). Row i's generator is seeded with `params.seed + i`
    (mod 2**64; a random base when the seed is None) unless `seeds` lists one seed per row.
    """

    def __init__(self, params: SamplingParams | None = None, num_rows: int = 0, draft_argmax: bool = False,
                 seeds: list[int] | None = None) -> None:
        self.params = params or SamplingParams()
        self.draft_argmax = draft_argmax
        self.generators: list[torch.Generator] = []
        if not self.params.greedy:
            # Not torch.seed(): it re-seeds torch's global generator, undoing the caller's torch.manual_seed.
            self.base = self.params.seed if self.params.seed is not None else secrets.randbits(63)
            self.add_rows(seeds if seeds is not None else [None] * num_rows)

    def add_rows(self, seeds: list[int | None]) -> None:
        """Generators for rows after the existing ones (rows joining a running decode too): each its seed, or
        for None the row's `params.seed + row`; nothing to add when greedy."""
        if not self.params.greedy:
            first = len(self.generators)
            # Row seeds wrap at 2**64 (torch's seed range): seed 2**64 - 1 would otherwise overflow at row 1.
            self.generators += [torch.Generator().manual_seed((self.base + first + i) % 2**64 if seed is None
                                                              else seed) for i, seed in enumerate(seeds)]

    def _rows(self, row_ids: torch.Tensor) -> list[torch.Generator]:
        rows = row_ids.tolist()
        if rows and max(rows) >= len(self.generators):
            raise InputError(f"this Selector holds {len(self.generators)} row generators but the batch has row "
                             f"{max(rows)}; build it with Selector(params, num_rows=len(prompts))")
        return [self.generators[row] for row in rows]

    def first_token(self, logits: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
        """The token after the prompt from the target's logits [B, V] -> [B]."""
        if self.params.greedy:
            return logits.argmax(dim=-1)
        return sample(logits_to_probs(logits, self.params), self._rows(row_ids)).to(logits.device)

    def propose(self, draft_logits, anchors, row_ids):
        """Proposals [B, K-1] and the draft's q [B, K-1, V] (None when greedy) from draft logits [B, K-1, V].

        draft_logits None means an empty block (the target alone): no proposals.
        """
        if draft_logits is None:
            return anchors.new_zeros(anchors.shape[0], 0), None
        if self.params.greedy:
            return draft_logits.argmax(dim=-1), None
        if self.draft_argmax:
            proposals = draft_logits.argmax(dim=-1)
            q = torch.nn.functional.one_hot(proposals, draft_logits.shape[-1]).float()
            if not bool(torch.isfinite(draft_logits.amax(dim=-1)).all()):
                raise InputError("the draft's logits contain NaN/inf; the draft checkpoint is broken, reload or "
                                 "retrain it (the target alone, --baseline, is unaffected)")
            return proposals, q
        q = logits_to_probs(draft_logits, self.params)
        return sample(q, self._rows(row_ids)).to(anchors.device), q

    def point_mass(self, proposals: torch.Tensor, vocab_size: int):
        """Fixed proposals [B, n] (a lookup block): themselves and their q, one-hot [B, n, V] (None when greedy)."""
        if self.params.greedy:
            return proposals, None
        return proposals, torch.nn.functional.one_hot(proposals, vocab_size).float()

    def accept(self, target_logits, draft_probs, proposals, row_ids):
        """Number of accepted proposals [B] and the target's own token at slot a [B] (bonus or replacement)."""
        if self.params.greedy:
            return greedy_step(target_logits, proposals)
        p = logits_to_probs(target_logits, self.params)  # [B, K, V]
        q = draft_probs if draft_probs is not None else p.new_zeros(p.shape[0], 0, p.shape[-1])
        num_accepted, token = speculative_sample(p, q, proposals, self._rows(row_ids))
        return num_accepted.to(proposals.device), token.to(proposals.device)

    def tree_accept(self, target_logits, tree: Tree, row_ids):
        """Acceptance over a token tree (tree.py) from the target's logits at every node [B, N, V] ->
        (accepted nodes [B, N] bool, the target's own token after the deepest [B]). Greedy: the nodes that equal
        the target's argmax at their parent; sampled: point-mass tests (sampling/tree.py)."""
        if self.params.greedy:
            target_tokens = target_logits.argmax(dim=-1)  # [B, N]
            ok = accepted_nodes(tree, target_tokens)
            return ok, target_tokens.gather(1, deepest_node(ok)[:, None])[:, 0]
        p = logits_to_probs(target_logits, self.params)  # [B, N, V]
        return tree_sample(p, tree.tokens, tree.parents, self._rows(row_ids))
