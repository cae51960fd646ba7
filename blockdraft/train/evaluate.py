"""Held-out evaluation of a draft: teacher-forced block metrics and the online tau (docs/training.md §4).

Teacher-forced metrics (per-position accuracy acc_k and block tau at every anchor of the held-out data) are
diagnostics for training curves. The online tau, from the real decode loop with the target at T=0, is the
only acceptance number to report; it backs `blockdraft eval`.

Shapes: A anchors, K block size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..decode.decoder import Decoder
from ..decode.options import PRESETS
from ..metrics import AcceptanceStats
from .data import Example
from .forward import BlockForward, autocast, split_teacher, target_features
from .objective import (anchor_candidates, batch_vocab, block_targets, block_tau, scored_blocks,
                        weighted_loss)


@dataclass
class BlockMetrics:
    """Sums over supervised block slots, pooled before dividing (over micro-batches, steps and ranks).

    sums [4 + 2K] float64: Σ w·CE, Σ w, Σ tau over full blocks, full blocks, then hits per slot [K] and
    supervised slots [K]. Ranks all-reduce `sums` as one tensor.
    """

    block_size: int
    sums: torch.Tensor

    @classmethod
    def zeros(cls, block_size: int, device) -> BlockMetrics:
        return cls(block_size, torch.zeros(4 + 2 * block_size, dtype=torch.float64, device=device))

    def add(self, total: torch.Tensor, hits: torch.Tensor, weights: torch.Tensor,
            supervised: torch.Tensor | None = None) -> None:
        """Count one batch: total = Σ w·CE (scalar), hits and weights [B, A, K]. `supervised` [B, A, K] bool
        (default weights > 0): the slots accuracy and tau count, a superset of the scored ones when a head over
        fewer ids left some labels out (those count as misses: the draft could not propose them)."""
        supervised = weights > 0 if supervised is None else supervised
        full = supervised[..., -1]  # [B, A]: the whole block is supervised
        taus = block_tau(hits[..., 1:])[full]
        head = torch.stack([total.detach().double(), weights.double().sum(), taus.double().sum(),
                            full.double().sum()])
        slots = torch.cat([hits.double().sum((0, 1)), supervised.double().sum((0, 1))])  # [2K]
        self.sums += torch.cat([head, slots]).to(self.sums.device)

    def summary(self) -> dict:
        """loss (Σ w·CE / Σ w), acc [acc_1..acc_{K-1}], tf_tau (None without full blocks), supervised weight."""
        K = self.block_size
        loss_sum, weight, tau_sum, full = self.sums[:4].tolist()
        hits, counted = self.sums[4 : 4 + K], self.sums[4 + K :]
        acc = [round(h / c, 5) if c else None for h, c in zip(hits[1:].tolist(), counted[1:].tolist())]
        return {"loss": round(loss_sum / weight, 5) if weight else None, "acc": acc,
                "tf_tau": round(tau_sum / full, 4) if full else None, "weight": round(weight, 3)}


@torch.no_grad()
def evaluate_teacher_forced(forward: BlockForward, head: torch.Tensor, examples: list[Example], *, gamma: float,
                            max_seq_len: int, anchors_per_pass: int = 512,
                            autocast_dtype: torch.dtype | None = None, cache=None,
                            indices: list[int] | None = None, vocab: torch.Tensor | None = None) -> BlockMetrics:
    """Block metrics of the draft over held-out examples, with an anchor at every position of C.

    One target forward per example (or none: a FeatureCache `cache` keyed by the examples' dataset
    `indices`); its anchors run in passes of `anchors_per_pass` blocks. `vocab`: score over the proposal
    vocabulary joined with the example's prompt ids, as training with `proposal_vocab` does; a label outside them
    counts as a miss.
    """
    target, K = forward.target, forward.draft.config.block_size
    metrics = BlockMetrics.zeros(K, target.device)
    for n, example in enumerate(examples):
        tokens = torch.tensor([example.input_ids[:max_seq_len]], device=target.device)  # [1, S]
        loss_mask = torch.tensor([example.loss_mask[:max_seq_len]], device=target.device)
        candidates = anchor_candidates(loss_mask)[0].nonzero()[:, 0]
        if candidates.numel() == 0:
            continue
        if cache is not None:
            # A KD run's cache also holds the teacher states; the held-out metrics are plain CE and accuracy.
            features, _ = split_teacher(cache.features(tokens, [indices[n]], [tokens.shape[1]]),
                                        forward.draft.fc.in_features)
        else:
            features = target_features(target, tokens, forward.draft.config.target_layer_ids)
        for start in range(0, candidates.numel(), anchors_per_pass):
            anchors = candidates[start : start + anchors_per_pass][None]  # [1, A]
            keep = torch.ones_like(anchors, dtype=torch.bool)
            blocks = block_targets(tokens, loss_mask, anchors, keep, K, gamma)
            scored = batch_vocab(vocab, tokens, loss_mask)
            kept = scored_blocks(blocks, scored)
            with autocast(target.device, autocast_dtype):  # the head too: it is in the autocast dtype
                hidden = forward(tokens, anchors, keep, features)
                total, hits = weighted_loss(hidden, head, kept, vocab=scored)
            metrics.add(total, hits, kept.weights, blocks.weights > 0)
    return metrics


def heldout_prompts(examples: list[Example]) -> list[list[int]]:
    """The prompt of each example: its ids before the first supervised token (examples without one are skipped)."""
    prompts = []
    for example in examples:
        if 1 in example.loss_mask:
            first = example.loss_mask.index(1)
            if first > 0:
                prompts.append(example.input_ids[:first])
    return prompts


def evaluate_online(target, draft, prompt_ids_list: list[list[int]], max_new_tokens: int,
                    block_size: int | None = None, *, batch_size: int = 8,
                    on_batch: Callable[[int], None] | None = None, tree: bool = False) -> AcceptanceStats:
    """Greedy speculative decoding over held-out prompts; pooled tau, its 1..K histogram, per-position acceptance.
    `tree` verifies token trees of K nodes instead of the block (decode/tree.py).

    Prompts run `batch_size` at a time. `seconds` is the total wall time; `new_tokens` counts returned tokens.
    """
    decoder = Decoder(target, draft, replace(PRESETS["tree" if tree else "chain"], block_size=block_size))
    stats = AcceptanceStats(decoder.block_size())
    start = time.perf_counter()
    for first in range(0, len(prompt_ids_list), batch_size):
        chunk = prompt_ids_list[first : first + batch_size]
        for result in decoder.generate(chunk, max_new_tokens=max_new_tokens):
            stats = stats.merge(result.stats)
        if on_batch is not None:
            on_batch(len(chunk))  # progress: prompts done
    # Each row's stats carry the wall time of its whole batch; summing them would count a batch many times.
    stats.seconds = time.perf_counter() - start
    return stats
