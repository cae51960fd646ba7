"""Turning logits into tokens inside the decode loop: greedy argmax, exact rejection sampling, or exact coupled
sampling (Gumbel noise keyed by position, sampling/gumbel.py).

The selector is the only place where the decode loop meets the sampling math; the math itself lives in
`blockdraft.sampling` as pure functions, and the one logits -> probs transform runs identically on the
target's logits (p) and the draft's (q). Each caller row owns one torch.Generator (rejection sampling) or one
seed (coupled sampling), so a row draws the same numbers whatever batch it shares and whichever rows finish
before it.

Every method that picks tokens takes `positions`: the absolute position of each token it picks ([B] or [B, n]).
Only coupled sampling reads them; it is what makes its samples independent of the block, tree and batch.

Shapes: B live rows, K block size, V vocabulary, N' proposal vocabulary.
"""

from __future__ import annotations

import secrets

import torch

from ..errors import InputError
from ..sampling import SamplingParams, greedy_step, logits_to_probs, sample, speculative_sample
from ..sampling.argmax import first_argmax
from ..sampling.gumbel import gumbel_noise, perturbed_scores
from ..sampling.tree import accepted_nodes, deepest_node, tree_sample
from .tree import Tree

# Coupled sampling ranks a tree's candidates by softmax((log q + RANK_NOISE * g) / RANK_TEMPERATURE): the draft's
# guess of how likely each token is to be the target's pick, argmax(log p + g). Trusting q fully with the whole
# noise (1, 1) grows one deep path; ignoring the noise (weight 0) takes q's top candidates, as rejection sampling's
# point-mass trees do. Measured with the shipped draft (8 prompts, 96 tokens, temperature 0.7, fixed trees of 8
# nodes, bf16), tau on HumanEval / MT-Bench: temperature 1, 1.5, 2, 3 at full noise 1.744, 1.800, 1.795, 1.689 /
# -, 1.512, 1.469, 1.473; at temperature 1.5, noise weight 0 1.873 / 1.495, 0.5 1.844 / 1.544. Rejection
# sampling's trees on the same prompts: 1.827 / 1.482.
RANK_NOISE = 0.5
RANK_TEMPERATURE = 1.5

SAMPLERS = ("auto", "coupled", "rejection")


class Selector:
    """Greedy (temperature 0) or sampled selection for rows identified by the caller's row ids.

    `draft_argmax=True` proposes the draft's argmax instead of sampling from q; acceptance then uses the
    one-hot q, which is still exact (docs/design.md §3). `coupled=True` samples by the Gumbel-max trick with noise
    keyed by (row seed, position) instead (sampling/gumbel.py): the draft proposes with the same noise and the
    target's picks are deterministic, so acceptance is greedy acceptance of perturbed scores and a seed gives
    the target-alone sample of that seed. Row i is seeded with `params.seed + i` (mod 2**64; a random base when
    the seed is None) unless `seeds` lists one seed per row.
    """

    def __init__(self, params: SamplingParams | None = None, num_rows: int = 0, draft_argmax: bool = False,
                 seeds: list[int] | None = None, coupled: bool = False) -> None:
        self.params = params or SamplingParams()
        self.draft_argmax = draft_argmax
        self.coupled = coupled and not self.params.greedy
        self.row_seeds: list[int] = []
        self.generators: list[torch.Generator] = []
        self._noise: list[dict[int, torch.Tensor]] = []  # per row: position -> its noise [V] (coupled only)
        self._noised: set[int] = set()  # rows whose noise is cached
        if not self.params.greedy:
            # Not torch.seed(): it re-seeds torch's global generator, undoing the caller's torch.manual_seed.
            self.base = self.params.seed if self.params.seed is not None else secrets.randbits(63)
            self.add_rows(seeds if seeds is not None else [None] * num_rows)

    @property
    def deterministic(self) -> bool:
        """Whether the target's pick is a function of its logits and the position (greedy or coupled): guesses are
        then accepted by equality with it, and a fixed guess needs no q."""
        return self.params.greedy or self.coupled

    def add_rows(self, seeds: list[int | None]) -> None:
        """Seeds for rows after the existing ones (rows joining a running decode too): each its seed, or for
        None the row's `params.seed + row`; nothing to add when greedy."""
        if not self.params.greedy:
            first = len(self.row_seeds)
            # Row seeds wrap at 2**64 (torch's seed range): seed 2**64 - 1 would otherwise overflow at row 1.
            new = [(self.base + first + i) % 2**64 if seed is None else seed for i, seed in enumerate(seeds)]
            self.row_seeds += new
            self.generators += [torch.Generator().manual_seed(seed) for seed in new]
            self._noise += [{} for _ in new]

    def noise(self, row_ids: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Gumbel noise [B, n, V] for positions [B, n] of the rows `row_ids` [B] (coupled sampling).

        Each (row, position) is drawn once and kept until a later call asks only for positions past it: a step
        asks for the positions after its anchor, and the next step's anchor lies at or past the first of them.
        Every step asks for every live row, so a row missing from a call has finished: its noise is freed (a server
        batch that keeps admitting rows would otherwise keep a few MB per finished row).
        """
        if positions is None:
            raise InputError("coupled sampling needs the positions of the tokens it picks; pass `positions`")
        rows = self._row_list(row_ids)
        for finished in self._noised.difference(rows):
            self._noise[finished].clear()
        self._noised = set(rows)
        out = []
        for row, wanted in zip(rows, positions.tolist()):
            cache = self._noise[row]
            for old in [p for p in cache if p < min(wanted)]:  # committed positions are never asked for again
                del cache[old]
            missing = sorted({p for p in wanted if p not in cache})
            # Drawn on the CPU (the same numbers on any device), kept where the logits are: moved once, not per step.
            for p, values in zip(missing, gumbel_noise(self.row_seeds[row], missing, vocab_size).to(positions.device)):
                cache[p] = values
            out.append(torch.stack([cache[p] for p in wanted]))
        return torch.stack(out)  # [B, n, V]

    def _scores(self, logits: torch.Tensor, positions: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
        """log p + g [B, n, V] for logits [B, n, V] at positions [B, n]."""
        return perturbed_scores(logits, self.noise(row_ids, positions, logits.shape[-1]), self.params)

    def draft_scores(self, logits: torch.Tensor, ids: torch.Tensor | None, vocab_size: int, positions: torch.Tensor,
                     row_ids: torch.Tensor) -> torch.Tensor:
        """The scores that rank a token tree's candidates, from draft logits [B, n, V] (or [B, n, N'] over the
        proposal vocabulary `ids` [N']) at positions [B, n]: log q when greedy or rejection-sampling (point-mass
        tests need no particular q); when coupled, log softmax((log q + RANK_NOISE * g) / RANK_TEMPERATURE), the
        draft's guess of the target's pick."""
        if not self.coupled:
            return logits.log_softmax(dim=-1)
        noise = self.noise(row_ids, positions, vocab_size)  # [B, n, V]
        noise = noise if ids is None else noise[..., ids]
        return (perturbed_scores(logits, RANK_NOISE * noise, self.params) / RANK_TEMPERATURE).log_softmax(dim=-1)

    def pick_scores(self, logits: torch.Tensor, row_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The scores [B, n, V] whose argmax is the target's pick of the tokens at positions [B, n], from its logits
        [B, n, V]: the logits when greedy, log p + g when coupled (a deterministic selector only)."""
        if not self.deterministic:
            raise InputError("a rejection-sampling selector has no deterministic pick; use greedy or coupled")
        return logits if self.params.greedy else self._scores(logits, positions, row_ids)

    def _row_list(self, row_ids: torch.Tensor) -> list[int]:
        rows = row_ids.tolist()
        if rows and max(rows) >= len(self.row_seeds):
            raise InputError(f"this Selector holds {len(self.row_seeds)} row seeds but the batch has row "
                             f"{max(rows)}; build it with Selector(params, num_rows=len(prompts))")
        return rows

    def _rows(self, row_ids: torch.Tensor) -> list[torch.Generator]:
        return [self.generators[row] for row in self._row_list(row_ids)]

    def first_token(self, logits: torch.Tensor, row_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The token after the prompt from the target's logits [B, V] -> [B]; it lands at positions [B]."""
        if self.params.greedy:
            return first_argmax(logits)
        if self.coupled:
            return first_argmax(self._scores(logits[:, None], positions[:, None], row_ids)[:, 0])
        return sample(logits_to_probs(logits, self.params), self._rows(row_ids)).to(logits.device)

    def propose(self, draft_logits, anchors, row_ids, positions=None):
        """Proposals [B, K-1] and the draft's q [B, K-1, V] (None when greedy or coupled) from draft logits
        [B, K-1, V] for the tokens at positions [B, K-1].

        draft_logits None means an empty block (the target alone): no proposals.
        """
        if draft_logits is None:
            return anchors.new_zeros(anchors.shape[0], 0), None
        if self.params.greedy:
            return first_argmax(draft_logits), None
        if self.coupled:  # the draft's guess of the target's pick: argmax(log q + g) with the target's noise
            return first_argmax(self._scores(draft_logits, positions, row_ids)), None
        if self.draft_argmax:
            proposals = first_argmax(draft_logits)
            q = torch.nn.functional.one_hot(proposals, draft_logits.shape[-1]).float()
            if not bool(torch.isfinite(draft_logits.amax(dim=-1)).all()):
                raise InputError("the draft's logits contain NaN/inf; the draft checkpoint is broken, reload or "
                                 "retrain it (the target alone, --baseline, is unaffected)")
            return proposals, q
        q = logits_to_probs(draft_logits, self.params)
        return sample(q, self._rows(row_ids)).to(anchors.device), q

    def point_mass(self, proposals: torch.Tensor, vocab_size: int):
        """Fixed proposals [B, n] (a lookup block): themselves and their q, one-hot [B, n, V] (None when greedy
        or coupled)."""
        if self.deterministic:
            return proposals, None
        return proposals, torch.nn.functional.one_hot(proposals, vocab_size).float()

    def accept(self, target_logits, draft_probs, proposals, row_ids, positions=None, limits=None):
        """Number of accepted proposals [B] and the target's own token at slot a [B] (bonus or replacement), from
        the target's logits [B, K, V] for the tokens at positions [B, K]. `limits` [B] (a ragged block): row b
        proposed only its first limits[b] tokens; the rest is padding, never accepted, whose logits may be
        anything."""
        if limits is not None:  # a padding proposal equals no pick
            padding = torch.arange(proposals.shape[1], device=proposals.device)[None, :] >= limits[:, None]
        if self.deterministic:
            scores = self.pick_scores(target_logits, row_ids, positions)  # [B, K, V]
            if proposals.shape[1] == 0:  # a plain step: the pick alone (greedy_step's answer, in fewer ops)
                return proposals.new_zeros(proposals.shape[0]), first_argmax(scores[:, 0])
            return greedy_step(scores, proposals if limits is None else proposals.masked_fill(padding, -1))
        p = logits_to_probs(target_logits, self.params)  # [B, K, V]
        q = draft_probs if draft_probs is not None else p.new_zeros(p.shape[0], 0, p.shape[-1])
        num_accepted, token = speculative_sample(p, q, proposals, self._rows(row_ids), limits=limits)
        return num_accepted.to(proposals.device), token.to(proposals.device)

    def tree_accept(self, target_logits, tree: Tree, row_ids, positions=None, kept=None):
        """Acceptance over a token tree (tree.py) from the target's logits at every node [B, N, V], which pick the
        tokens at positions [B, N] (each node's position + 1) -> (accepted nodes [B, N] bool, the target's own
        token after the deepest [B]). Greedy: the nodes that equal the target's argmax at their parent; coupled:
        likewise over the perturbed scores; rejection sampling: point-mass tests (sampling/tree.py). `kept` [B, N]
        (closed under ancestors): the nodes a deterministic acceptance may take; the target's own pick after the
        deepest is then the same token a left-out node would have given."""
        if self.deterministic:
            target_tokens = first_argmax(self.pick_scores(target_logits, row_ids, positions))  # [B, N]
            ok = accepted_nodes(tree, target_tokens)
            if kept is not None:
                ok &= kept
            return ok, target_tokens.gather(1, deepest_node(ok)[:, None])[:, 0]
        p = logits_to_probs(target_logits, self.params)  # [B, N, V]
        return tree_sample(p, tree.tokens, tree.parents, self._rows(row_ids))
