"""The step costs of a target and draft, measured once (docs/design.md §14): from this process's memory, else the
disk cache, else timed now over fixed-width steps, and cached. The `Decoder` asks here once per decode; the cost
model itself (what a step of each width costs, fitted) is costs.py.
"""

from __future__ import annotations

import warnings

import torch

from ..io.targets import cache_root
from ..model.target import Target
from .costs import (PROMPT_LENGTH, RAGGED_PROMPT_LENGTH, STEPS_PER_ROUND, WARM_STEPS, CostModel, Stopwatch,
                    batch_bucket, cost_key, linear_costs, measure_costs, read_cached, stale_cache_note, write_cached)
from .drafter import Drafter
from .generate import stream
from .policy import candidate_widths
from .proposers import ChainProposer, TreeProposer, chain


def measured_costs(target: Target, drafter: Drafter, tree: bool, rows: int, fresh: bool = False) -> CostModel:
    """The step costs of this target and draft at batch sizes up to `rows` (costs.py): from this process's memory,
    else the disk cache, else measured now by timing fixed-width steps, and cached. `fresh` measures them again
    (once per process) and replaces the cached ones: after a first measurement on a busy machine."""
    config = getattr(drafter, "config", None)
    if config is None:  # a drafter double (tests) has no model to time: a plain step, the draft at a third of one
        return linear_costs(plain=1.0, draft=1 / 3, per_position=0.02)
    proposal_ids = None if drafter.vocab is None else int(drafter.vocab.numel())
    key = cost_key(target, config, drafter.block_size, tree, proposal_ids)
    memory_key = key or (id(target), id(drafter.draft), drafter.block_size, tree, proposal_ids)
    if fresh and memory_key not in _REMEASURED:
        _REMEASURED.add(memory_key)
        _COSTS[memory_key] = CostModel()
        key_on_disk = None  # the disk cache is not read, only written
    else:
        key_on_disk = key
    model = _COSTS.setdefault(memory_key, CostModel())
    buckets = [1 << i for i in range(batch_bucket(rows).bit_length())]  # 1, 2, 4, ... up to rows' bucket
    folder = cache_root() / "costs"
    if key_on_disk is not None and not set(buckets) <= model.buckets():
        cached = read_cached(folder, key_on_disk)
        if cached is not None:
            _check_cached(cached, target, drafter, tree)
        model.update(cached or CostModel())
    missing = [b for b in buckets if b not in model.buckets()]
    if missing:
        K = drafter.block_size
        widths = candidate_widths(2 * K if tree else K)
        model.update(measure_costs(lambda b, w, n: _timed_steps(target, drafter, tree, b, w, n), widths, missing,
                                   ragged_steps=lambda b, extras, n: _timed_ragged(target, drafter, b, extras, n)))
        if key is not None:
            write_cached(folder, key, model)
    return model


def _check_cached(cached: CostModel, target: Target, drafter: Drafter, tree: bool) -> None:
    """Warn where the cache's plain step of any batch size is far slower than a few timed now
    (costs.stale_cache_note). Every cached bucket is probed, since the whole cache is kept once read (a server
    reads it for its first 1-row bucket and prices every later batch from it): a measurement taken while other jobs
    ran can price one row right and a batch wrong (2 rows at 12.3 ms against 7.3 timed on the quiet machine)."""
    for bucket in sorted(cached.plain):
        probe = _timed_steps(target, drafter, tree, bucket, 1, WARM_STEPS + STEPS_PER_ROUND)[WARM_STEPS:]
        note = stale_cache_note(cached.plain[bucket], probe, rows=bucket) if probe else None
        if note:
            warnings.warn(note, stacklevel=4)
            return


_COSTS: dict = {}  # cost models measured or read in this process, by cost key
_REMEASURED: set = set()  # cost keys measured afresh in this process


def _timed_steps(target: Target, drafter: Drafter, tree: bool, rows: int, width: int, steps: int) -> list[float]:
    """The seconds of `steps` decode steps of `rows` rows at a fixed `width`, greedy, on a synthetic prompt."""
    watch = Stopwatch(width)
    vocab = int(target.lm_head.weight.shape[0])
    proposer = TreeProposer(drafter, watch) if tree else ChainProposer(drafter, watch, vocab_size=vocab)
    _run(target, proposer, rows, PROMPT_LENGTH, steps, per_step=width, room=4 * drafter.block_size)
    return watch.seconds


def _timed_ragged(target: Target, drafter: Drafter, rows: int, extras: list[int], steps: int) -> dict[int, list[float]]:
    """The seconds of `steps` ragged steps of `rows` rows at each count of `extras` (plain steps whose rows verify
    that many more positions between them: RaggedWatch; 0: plain steps), taken in turn in one decode of a longer
    prompt: one prefill for them all."""
    watch = RaggedWatch(drafter, extras)
    _run(target, watch, rows, RAGGED_PROMPT_LENGTH, steps * len(extras), per_step=16, room=32)
    return watch.by_extra()


def _run(target: Target, proposer, rows: int, prompt_length: int, steps: int, per_step: int, room: int) -> None:
    """Decode `rows` copies of a synthetic prompt of `prompt_length` positions (at most a quarter of the target's
    context) for `steps` steps, greedy, whatever the steps accept: up to `per_step` tokens a step, leaving `room`
    positions of the context free."""
    vocab = int(target.lm_head.weight.shape[0])
    length = max(4, min(prompt_length, target.max_positions // 4))
    prompt = [(i * 7919 + 11) % vocab for i in range(length)]
    budget = max(1, min((steps + 1) * per_step, target.max_positions - length - room))
    done = []

    def stop_after_steps():  # every row ends once `steps` steps are timed
        done.append(1)
        return range(rows) if len(done) > steps + 1 else []

    for _ in stream(target, proposer, [prompt] * rows, max_new_tokens=budget, stop_token_ids=[],
                    drop=stop_after_steps):
        pass


class RaggedWatch(Stopwatch):
    """A proposer of ragged steps that times them (costs.Stopwatch), cycling through `extras`: a step of e extra
    guesses spreads them over the rows, up to 15 a row from the first, each row's anchor repeated (a lookup run's
    cost does not depend on its tokens); e = 0 is a plain step."""

    def __init__(self, drafter: Drafter, extras: list[int]) -> None:
        super().__init__(1)
        self.drafter, self.extras, self.chosen = drafter, list(extras), []  # chosen: each step's extra guesses
        self.tap_layer_ids, self.block_size = drafter.tap_layer_ids, drafter.block_size
        self.lookahead = max(16, drafter.block_size)  # the cache room past the anchor: 15 guesses a row

    def propose(self, state, selector):
        self.choose()
        extra = self.extras[len(self.chosen) % len(self.extras)]
        self.chosen.append(extra)
        anchors, _ = state.anchors()  # [B]
        counts = [min(15, max(0, extra - 15 * b)) for b in range(anchors.shape[0])]
        proposal = chain(anchors, anchors[:, None].repeat(1, max(counts)), None, drafted=False, lookup=extra > 0)
        if extra:
            proposal.widths = 1 + torch.tensor(counts, device=anchors.device)  # [B]
        return proposal

    def by_extra(self) -> dict[int, list[float]]:
        """The seconds of the timed steps (`seconds`: each step's, up to the next one's start) by their extras."""
        out: dict[int, list[float]] = {e: [] for e in self.extras}
        for extra, seconds in zip(self.chosen, self.seconds):
            out[extra].append(seconds)
        return out

    def observe(self, proposal, ok, num_accepted) -> None:
        pass
