"""Prefill, loop `step`, stop, stream. The public decode entry points live here.

`stream` yields tokens as rows commit them; `generate` collects them into one GenerationResult per
prompt. Passing `draft=None` decodes with the target alone through the same code path: that is the
exactness oracle and the speed baseline.
"""

from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch

from ..errors import InputError
from ..io.drafts import LoadedDraft
from ..checks import check_against_target
from ..metrics import AcceptanceStats
from ..model.draft import DFlashDraftModel
from ..model.target import Target
from .drafter import Drafter
from .lookup import PromptLookup
from ..io.targets import cache_root
from .costs import (PROMPT_LENGTH, STEPS_PER_ROUND, WARM_STEPS, CostModel, Stopwatch, batch_bucket, cost_key,
                    linear_costs, measure_costs, read_cached, stale_cache_note, write_cached)
from .policy import candidate_widths, make_policy
from .proposers import ChainProposer, TargetAlone, TreeProposer
from .requests import check_request, check_stream_options, stop_ids
from .selection import Selector
from .state import DecodeState
from .step import prefill, step


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only, a stop token included when it ended the row
    finish_reason: str  # "stop" or "length"
    stats: AcceptanceStats


@dataclass
class StreamEvent:
    row: int  # index of the prompt in the caller's list
    tokens: list[int]  # newly committed tokens of that row (may be empty only at a row's end)
    finish_reason: str | None  # set on the row's last event: "stop" or "length"


@torch.inference_mode()
def stream(
    target: Target,
    draft: DFlashDraftModel | Drafter | None,
    prompts: list[list[int]],
    *,
    max_new_tokens: int = 256,
    block_size: int | None = None,
    stop_token_ids=None,
    selector: Selector | None = None,
    stats: list[AcceptanceStats] | None = None,
    adaptive: bool = False,
    lookup: bool | PromptLookup = False,
    tree: bool = False,
    drop: Callable[[], Iterable[int]] | None = None,
    admit: Callable[[int], list[Admission]] | None = None,
    room: int | None = None,
    costs: CostModel | None = None,
) -> Iterator[StreamEvent]:
    """Decode every prompt (lists of token ids) and yield tokens as they are committed.

    `max_new_tokens` is one budget, or a list with one per prompt. `drop`, when given, is asked after every
    step which rows (prompt indices) the caller no longer wants; they end at once, without a further event,
    and stop costing compute. `admit`, when given, is asked after every step for rows to join the decode
    (continuous batching): called with the most positions (prompt plus budget) a joining row may take, it
    returns Admissions, which become rows len(prompts), len(prompts) + 1, ... in order; once every row has
    finished it is asked once more, and the stream ends when nothing joins. A joining row is prefilled on its
    own and then decodes with the others; its output is what it would be alone. `room` sizes
    the caches for joining rows of up to that many positions (default: what the prompts themselves need; at
    most the target's context).

    `stats`, when given, receives one AcceptanceStats per prompt (filled in place). `adaptive` lets each
    step verify the number of proposals that currently pays best, down to none (policy.py): the output is
    unchanged, the speed never far below the target alone's. `lookup` (True, or a PromptLookup of the caller's)
    lets a step verify a block continued from an earlier occurrence of the row's
    last tokens instead of the draft's, when that pays more (lookup.py); the output is unchanged again.
    `tree` verifies the draft's likeliest alternatives too, as a token tree (tree.py): a fixed width then means a
    tree of K nodes, and `adaptive` picks from 1 to 2K nodes. Greedy output is unchanged; sampled output stays
    exactly distributed (point-mass tests, sampling/tree.py). An adaptive width or a lookup prices its steps with
    `costs` (costs.py); None measures them once for this target and draft (cached: `measured_costs`).
    """
    check_stream_options(block_size, adaptive, lookup, tree)
    drafter = as_drafter(target, draft, block_size)
    K = drafter.block_size if drafter else 1
    check_request(target, prompts, max_new_tokens, K, drafter.trained_block_size if drafter else None)
    stop_token_ids = stop_ids(stop_token_ids, target, lambda: eos_ids(target))
    selector = selector or Selector(num_rows=len(prompts))
    speculative = drafter is not None and K > 1
    tree = tree and speculative
    if speculative and costs is None and (adaptive is True or lookup is True):
        costs = measured_costs(target, drafter, tree, len(prompts))
    finder = make_lookup(K, lookup, costs, getattr(drafter, "ngrams", None)) if speculative else None
    # Slots past the anchor's that a step may write: K, a lookup block's width, or a tree's nodes (up to 2K, and
    # a lookup run grafted onto them).
    looked = finder.width if finder is not None else 0
    ahead = max(K, looked, 2 * K + looked if tree else 0)
    need = max(len(p) for p in prompts) + max(_as_list(max_new_tokens, len(prompts)))
    capacity = max(need, min(room or 0, target.max_positions)) + ahead
    state = DecodeState(prompts, capacity, max_new_tokens, stop_token_ids, target.device)
    state.target_cache = target.new_cache(len(prompts), capacity)
    if drafter is not None:
        drafter.start(len(prompts), capacity, prompts)
    proposer = make_proposer(drafter, K, adaptive, finder, tree, costs, int(target.lm_head.weight.shape[0]))
    events = prefill(state, target, proposer, selector)
    while True:
        for row, tokens in events:
            yield StreamEvent(row, tokens, state.results[row].finish_reason)
        if drop is not None:
            state.drop(drop())
        live = state.live_rows()
        if live.shape[0] < state.batch:  # finished rows stop costing compute
            state.keep_rows(live)
            state.target_cache.keep_rows(live)
            if drafter is not None:
                drafter.keep_rows(live)
        joining = admit(capacity - ahead) if admit is not None else []
        if joining:  # their first tokens are streamed next; a joining row may finish at its first token
            events = join(state, target, drafter, proposer, selector, stats, joining, capacity, capacity - ahead,
                          stop_token_ids)
            continue
        if not state.batch:
            return
        events = step(state, target, proposer, selector, stats)


@dataclass
class Admission:
    """A row joining a running decode: its prompt ids, its budget, and its sampling seed (None: greedy, or
    random)."""

    prompt: list[int]
    max_new_tokens: int
    seed: int | None = None


def join(state: DecodeState, target: Target, drafter, proposer, selector: Selector, stats, joining: list[Admission],
         capacity: int, room: int, stop_token_ids) -> list[tuple[int, list[int]]]:
    """Prefill the joining rows on their own cache (of the decode's `capacity`) and append them to the decode;
    returns their first tokens' events. Each must fit `room` positions, prompt and budget together."""
    prompts = [list(a.prompt) for a in joining]
    budgets = [a.max_new_tokens for a in joining]
    for prompt, budget in zip(prompts, budgets):
        if not prompt or budget < 1 or len(prompt) + budget > room:
            raise InputError(f"a joining row needs a non-empty prompt and at least one new token within {room} "
                             f"positions (got a prompt of {len(prompt)} and a budget of {budget}); admit only "
                             "rows that fit the room `admit` is given")
    K = drafter.block_size if drafter is not None else 1
    check_request(target, prompts, budgets, K, drafter.trained_block_size if drafter else None)
    new = DecodeState(prompts, capacity, budgets, stop_token_ids, target.device, first_row=len(state.results))
    new.target_cache = target.new_cache(len(prompts), capacity)
    selector.add_rows([a.seed for a in joining])
    if stats is not None:
        stats += [AcceptanceStats(K) for _ in joining]
    events = prefill(new, target, proposer, selector)
    state.add_rows(new)
    if drafter is not None:
        drafter.add_rows(prompts)
    return events


def generate(target, draft, prompts, *, max_new_tokens=256, block_size=None, stop_token_ids=None, selector=None,
             adaptive=False, lookup=False, tree=False, costs: CostModel | None = None,
             on_tokens: Callable[[int, list[int]], None] | None = None) -> list[GenerationResult]:
    """Decode every prompt to completion as one batch (`stream`'s options); one GenerationResult per prompt, in
    order, each with its statistics (tokens per second over the batch's wall time). `on_tokens(row, tokens)` sees
    the tokens as they are committed."""
    check_stream_options(block_size, adaptive, lookup, tree)
    drafter = as_drafter(target, draft, block_size)
    K = drafter.block_size if drafter else 1
    if drafter is not None and K > 1 and costs is None and (adaptive is True or lookup is True):
        costs = measured_costs(target, drafter, tree, len(prompts))  # measured (once) before the clock starts
    stats = [AcceptanceStats(K) for _ in prompts]
    tokens: list[list[int]] = [[] for _ in prompts]
    reasons: list[str] = ["length"] * len(prompts)
    start = time.perf_counter()
    for event in stream(target, drafter, prompts, max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids,
                        selector=selector, stats=stats, adaptive=adaptive, lookup=lookup, tree=tree, costs=costs):
        tokens[event.row].extend(event.tokens)
        if on_tokens is not None:
            on_tokens(event.row, event.tokens)
        if event.finish_reason is not None:
            reasons[event.row] = event.finish_reason
    if target.device.type == "cuda":
        torch.cuda.synchronize(target.device)
    elapsed = time.perf_counter() - start
    for s, t in zip(stats, tokens):
        s.seconds, s.new_tokens = elapsed, len(t)
    return [GenerationResult(t, r, s) for t, r, s in zip(tokens, reasons, stats)]


def make_lookup(block_size: int, lookup, costs: CostModel | None, table=None) -> PromptLookup | None:
    """lookup: False (none), True (a fresh PromptLookup pricing its steps with `costs`, with the draft's n-gram
    `table` where it has one), or a PromptLookup, used as is."""
    if isinstance(lookup, PromptLookup):
        return lookup
    return PromptLookup(block_size, costs, table=table) if lookup else None


def make_proposer(drafter: Drafter | None, block_size: int, adaptive, lookup: PromptLookup | None, tree: bool,
                  costs: CostModel | None, vocab_size: int):
    """The proposer of a decode (proposers.py): the target alone without a draft, else the draft's chain or tree
    at widths from `adaptive` (True: a fresh adaptive policy over `costs`, False: the full block, or a policy
    object used as is), with `lookup` grafted onto the tree or competing with the chain."""
    if drafter is None:
        return TargetAlone()
    policy = make_policy(block_size, adaptive, costs, tree) if isinstance(adaptive, bool) else adaptive
    return TreeProposer(drafter, policy, lookup) if tree else ChainProposer(drafter, policy, lookup, vocab_size)


def measured_costs(target: Target, drafter: Drafter, tree: bool, rows: int, fresh: bool = False) -> CostModel:
    """The step costs of this target and draft at batch sizes up to `rows` (costs.py): from this process's memory,
    else the disk cache, else measured now by timing fixed-width steps, and cached. `fresh` measures them again
    (once per process) and replaces the cached ones: after a first measurement on a busy machine."""
    config = getattr(drafter, "config", None)
    if config is None:  # a drafter double (tests) has no model to time: a plain step, the draft at a third of one
        return linear_costs(plain=1.0, draft=1 / 3, per_position=0.02)
    key = cost_key(target, config, drafter.block_size, tree)
    memory_key = key or (id(target), id(drafter.draft), drafter.block_size, tree)
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
        if cached is not None and 1 in cached.plain:
            _check_cached(cached.plain[1], target, drafter, tree)
        model.update(cached or CostModel())
    missing = [b for b in buckets if b not in model.buckets()]
    if missing:
        K = drafter.block_size
        widths = candidate_widths(2 * K if tree else K)
        model.update(measure_costs(lambda b, w, n: _timed_steps(target, drafter, tree, b, w, n), widths, missing))
        if key is not None:
            write_cached(folder, key, model)
    return model


def _check_cached(cached_plain: float, target: Target, drafter: Drafter, tree: bool) -> None:
    """Warn where a plain step of the cache is far slower than a few timed now (costs.stale_cache_note)."""
    probe = _timed_steps(target, drafter, tree, 1, 1, WARM_STEPS + STEPS_PER_ROUND)[WARM_STEPS:]
    note = stale_cache_note(cached_plain, probe) if probe else None
    if note:
        warnings.warn(note, stacklevel=4)


_COSTS: dict = {}  # cost models measured or read in this process, by cost key
_REMEASURED: set = set()  # cost keys measured afresh in this process


def _timed_steps(target: Target, drafter: Drafter, tree: bool, rows: int, width: int, steps: int) -> list[float]:
    """The seconds of `steps` decode steps of `rows` rows at a fixed `width`, greedy, on a synthetic prompt."""
    vocab = int(target.lm_head.weight.shape[0])
    length = max(4, min(PROMPT_LENGTH, target.max_positions // 4))
    prompt = [(i * 7919 + 11) % vocab for i in range(length)]
    budget = max(1, min((steps + 1) * width, target.max_positions - length - 4 * drafter.block_size))
    watch, done = Stopwatch(width), []

    def stop_after_steps():  # every row ends once `steps` steps are timed
        done.append(1)
        return range(rows) if len(done) > steps + 1 else []

    for _ in stream(target, drafter, [prompt] * rows, max_new_tokens=budget, block_size=drafter.block_size,
                    stop_token_ids=[], adaptive=watch, tree=tree, drop=stop_after_steps):
        pass
    return watch.seconds


def _as_list(budget, count: int) -> list[int]:
    return list(budget) if isinstance(budget, (list, tuple)) else [budget] * count


def as_drafter(target: Target, draft, block_size: int | None):
    """A loaded draft (or a bare draft module) becomes a Drafter at the requested block size; a Drafter-like
    object passes through.

    A draft is checked against the target first (once per pair): its shape and interface (docs/format.md), and
    that it lies on the target's device in its dtype, as `load_draft(path, target)` places it."""
    if isinstance(draft, DFlashDraftModel):
        draft = LoadedDraft(draft)
    if not isinstance(draft, LoadedDraft):
        return draft
    if _CHECKED.get(draft.module) is not target:
        # The last-layer id is a portability rule of load_draft (docs/format.md §3.1); this loop taps it as HF does.
        check_against_target(draft.config, target.config, allow_last_layer=True)
        weight = draft.module.fc.weight
        if (weight.device, weight.dtype) != (target.device, target.dtype):
            raise InputError(f"the draft's weights are {str(weight.dtype).removeprefix('torch.')} on {weight.device} "
                             f"but the target runs {str(target.dtype).removeprefix('torch.')} on {target.device}; "
                             "load the draft with load_draft(path, target), which places it beside the target")
        _CHECKED[draft.module] = target
    return Drafter(draft, target, block_size)


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # draft module -> the target it was checked with


def eos_ids(target: Target) -> set[int]:
    ids = set()
    for source in (getattr(target.model, "generation_config", None), target.config, target.tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    return ids
