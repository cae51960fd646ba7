"""The step costs of a target and draft, measured once (docs/design.md §14): from this process's memory, else the
disk cache, else timed now over fixed-width steps, and cached. The `Decoder` asks here once per decode; the cost
model itself (what a step of each width costs, fitted) is costs.py.
"""

from __future__ import annotations

import time
import warnings

import torch

from ..io.targets import cache_root
from ..model.target import Target
from .cost_key import cost_key
from .costs import (PLAIN, PROMPT_LENGTH, STEPS_PER_ROUND, TIMED_WIDTHS, WARM_STEPS, CostModel, batch_bucket,
                    linear_costs, measure_costs, read_cached, stale_cache_note, write_cached)
from .cpu_wait import WaitWatch, busy
from .drafter import Drafter
from .generate import stream
from .policy import candidate_widths
from .proposers import ChainProposer, TreeProposer, chain


def measured_costs(target: Target, drafter: Drafter, tree: bool, rows: int, fresh: bool = False) -> CostModel:
    """The step costs of this target and draft at batch sizes up to `rows` (costs.py): from this process's memory,
    else the disk cache, else measured now by timing every kind of step in turn (`CycleWatch`), and cached. A
    cached bucket timed on a busy machine is measured again where this one is quiet now (`_checked`). `fresh`
    measures them all again (once per process) and replaces the cached ones."""
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
            cached = _checked(cached, target, drafter, tree)
        model.update(cached or CostModel())
    missing = [b for b in buckets if b not in model.buckets()]
    if missing:
        K = drafter.block_size
        widths = timed_widths(2 * K if tree else K)
        measured = measure_costs(lambda b, kinds, n: timed_kinds(target, drafter, tree, b, kinds, n), widths,
                                 missing)
        if measured.busy_buckets():
            warnings.warn(busy_note(measured, "kept for this run and measured again at the next start on a quiet "
                                              "machine (or run once with --measure-costs)"), stacklevel=3)
        model.update(measured)
        if key is not None:
            write_cached(folder, key, model)
    return model


def timed_widths(max_width: int) -> list[int]:
    """The drafted widths a cost table times: the policy's candidates up to `max_width` and costs.TIMED_WIDTHS
    below it, where a step's cost bends (a grafted tree or a run may verify any width between)."""
    return sorted(set(candidate_widths(max_width)) | {w for w in TIMED_WIDTHS if w < max_width})


def _checked(cached: CostModel, target: Target, drafter: Drafter, tree: bool) -> CostModel:
    """The cached model to use: less the buckets timed on a busy machine where this one is quiet now (they are then
    measured again and the cache replaced), else all of it. A few plain steps of every cached bucket are timed now:
    a warning names a cache whose plain step is far slower than now (costs.stale_cache_note), and the share of
    them our threads waited for a CPU tells whether the machine is quiet now (cpu_wait.py). Every bucket is probed,
    since the whole cache is kept once read (a server reads it for its first 1-row bucket and prices every later
    batch from it): a measurement taken while other jobs ran can price one row right and a batch wrong (2 rows at
    12.3 ms against 7.3 timed on the quiet machine)."""
    probes = {}  # bucket -> its plain steps' seconds now
    with WaitWatch(torch.get_num_threads()) as waiting:
        for bucket in sorted(cached.plain):
            probes[bucket] = timed_kinds(target, drafter, tree, bucket, [PLAIN], WARM_STEPS + STEPS_PER_ROUND)[PLAIN]
    again = cached.busy_buckets() if not busy(waiting.share) else set()
    stale = [stale_cache_note(cached.plain[b], probe[WARM_STEPS:], rows=b) for b, probe in probes.items()
             if b not in again and probe[WARM_STEPS:]]
    if any(stale):
        warnings.warn(next(note for note in stale if note), stacklevel=4)
    if again:
        warnings.warn(busy_note(cached, "the machine is quiet now: measuring them again"), stacklevel=4)
    elif cached.busy_buckets():
        warnings.warn(busy_note(cached, f"the machine is busy now too ({waiting.share:.0%}): kept, and measured "
                                        "again at a start on a quiet machine (or run once with --measure-costs)"),
                      stacklevel=4)
    return cached.without(again)


def busy_note(model: CostModel, then: str) -> str:
    """A line naming the batch sizes of `model` timed on a busy machine, ending in what happens `then`."""
    again = sorted(model.busy_buckets())
    rows = ", ".join(str(b) for b in again)
    share = max(model.waited[b] for b in again)
    return (f"the step costs of {rows} row{'s' if again != [1] else ''} were timed while our threads waited "
            f"{share:.0%} of the time for a CPU (other jobs ran, or more threads than cores), which prices "
            f"speculation wrong: {then}")


_COSTS: dict = {}  # cost models measured or read in this process, by cost key
_REMEASURED: set = set()  # cost keys measured afresh in this process


def timed_kinds(target: Target, drafter: Drafter, tree: bool, rows: int, kinds: list[tuple[str, int]],
                cycles: int) -> dict[tuple[str, int], list[float]]:
    """The seconds of each kind of step (costs.step_kinds), one per cycle, over `cycles` cycles that take the kinds
    in turn in one decode of `rows` rows of a synthetic prompt, greedy, whatever the steps accept (`CycleWatch`)."""
    watch = CycleWatch(drafter, tree, kinds, int(target.lm_head.weight.shape[0]))
    _run(target, watch, rows, PROMPT_LENGTH, cycles * len(kinds) + 1, per_step=watch.lookahead,
         room=watch.lookahead + 4 * drafter.block_size)
    return watch.by_kind()


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


class _Chosen:
    """The width policy of CycleWatch's inner proposer: the width CycleWatch chose for this step."""

    def __init__(self) -> None:
        self.width = 1

    def at_batch(self, rows: int) -> None:
        pass

    def choose(self) -> int:
        return self.width

    def observe(self, width: int, num_accepted: list[int], within=None) -> None:
        pass


class CycleWatch:
    """A proposer that takes every kind of step in turn and times each (from its proposal to the next step's: the
    whole step, loop included): ("width", w) the draft's tree (or chain) of w nodes, w = 1 a plain step; ("extra", e)
    a ragged step of e extra guesses spread over the rows, up to 15 a row from the first, each row's anchor repeated
    (a lookup run's cost does not depend on its tokens), no draft. As in a served decode, the draft takes in the
    positions that plain and ragged steps committed at the next drafted step."""

    def __init__(self, drafter: Drafter, tree: bool, kinds: list[tuple[str, int]], vocab_size: int) -> None:
        self.kinds, self.chosen = list(kinds), _Chosen()
        self.inner = TreeProposer(drafter, self.chosen) if tree else ChainProposer(drafter, self.chosen,
                                                                                   vocab_size=vocab_size)
        self.drafter, self.block_size, self.tap_layer_ids = drafter, drafter.block_size, drafter.tap_layer_ids
        self.lookahead = max(self.inner.lookahead, 16)  # the cache room past the anchor: 15 guesses a row
        self.taken: list[tuple[str, int]] = []  # each step's kind
        self.starts: list[float] = []  # each step's start (perf_counter)

    def propose(self, state, selector):
        self.starts.append(time.perf_counter())
        kind, n = self.kinds[len(self.taken) % len(self.kinds)]
        self.taken.append((kind, n))
        if kind == "width":
            self.chosen.width = n
            return self.inner.propose(state, selector)
        anchors, _ = state.anchors()  # [B]
        counts = [min(15, max(0, n - 15 * b)) for b in range(anchors.shape[0])]
        proposal = chain(anchors, anchors[:, None].repeat(1, max(counts)), None, drafted=False, lookup=True)
        proposal.widths = 1 + torch.tensor(counts, device=anchors.device)  # [B]
        return proposal

    def observe(self, proposal, ok, num_accepted) -> None:
        if self.taken[-1][0] == "width":
            self.inner.observe(proposal, ok, num_accepted)

    def by_kind(self) -> dict[tuple[str, int], list[float]]:
        """Each kind's seconds, one per whole cycle timed (a step ends where the next one starts)."""
        out: dict = {kind: [] for kind in self.kinds}
        steps = (len(self.starts) - 1) // len(self.kinds) * len(self.kinds)
        for kind, start, end in zip(self.taken[:steps], self.starts[:steps], self.starts[1: steps + 1]):
            out[kind].append(end - start)
        return out
