"""Prefill, loop `step`, stop, stream: the decode engine under `Decoder` (decoder.py).

`stream` yields tokens as rows commit them; `generate` collects them into one GenerationResult per prompt. Both
take a ready proposer (proposers.py), which the Decoder builds from DecodeOptions; `TargetAlone()` decodes with the
target alone through the same code path: that is the exactness oracle and the speed baseline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch

from ..errors import InputError
from ..metrics import AcceptanceStats
from ..model.target import Target
from .proposers import Proposer
from .requests import check_request, eos_ids, stop_ids
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
    proposer: Proposer,
    prompts: list[list[int]],
    *,
    max_new_tokens: int = 256,
    stop_token_ids=None,
    selector: Selector | None = None,
    stats: list[AcceptanceStats] | None = None,
    drop: Callable[[], Iterable[int]] | None = None,
    admit: Callable[[int], list[Admission]] | None = None,
    room: int | None = None,
) -> Iterator[StreamEvent]:
    """Decode every prompt (lists of token ids) with `proposer`'s guesses and yield tokens as they are committed.

    The proposer (proposers.py) is what `Decoder` builds from DecodeOptions: the target alone, the draft's chain
    or token tree at fixed or adaptive widths, with or without prompt lookup; it is used for this decode only.
    `max_new_tokens` is one budget, or a list with one per prompt. `drop`, when given, is asked after every
    step which rows (prompt indices) the caller no longer wants; they end at once, without a further event,
    and stop costing compute. `admit`, when given, is asked after every step for rows to join the decode
    (continuous batching): called with the most positions (prompt plus budget) a joining row may take, it
    returns Admissions, which become rows len(prompts), len(prompts) + 1, ... in order; once every row has
    finished it is asked once more, and the stream ends when nothing joins. A joining row is prefilled on its
    own and then decodes with the others; its output is what it would be alone. `room` sizes
    the caches for joining rows of up to that many positions (default: what the prompts themselves need; at
    most the target's context). `stats`, when given, receives one AcceptanceStats per prompt (filled in place).
    """
    drafter = proposer.drafter
    check_request(target, prompts, max_new_tokens, proposer.block_size,
                  drafter.trained_block_size if drafter else None)
    stop_token_ids = stop_ids(stop_token_ids, target, lambda: eos_ids(target))
    selector = selector or Selector(num_rows=len(prompts))
    ahead = proposer.lookahead  # the slots past the anchor's that a step may write
    need = max(len(p) for p in prompts) + max(_as_list(max_new_tokens, len(prompts)))
    capacity = max(need, min(room or 0, target.max_positions)) + ahead
    state = DecodeState(prompts, capacity, max_new_tokens, stop_token_ids, target.device)
    state.target_cache = target.new_cache(len(prompts), capacity)
    if drafter is not None:
        drafter.start(len(prompts), capacity, prompts)
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
            events = join(state, target, proposer, selector, stats, joining, capacity, capacity - ahead,
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


def join(state: DecodeState, target: Target, proposer: Proposer, selector: Selector, stats,
         joining: list[Admission], capacity: int, room: int, stop_token_ids) -> list[tuple[int, list[int]]]:
    """Prefill the joining rows on their own cache (of the decode's `capacity`) and append them to the decode;
    returns their first tokens' events. Each must fit `room` positions, prompt and budget together."""
    prompts = [list(a.prompt) for a in joining]
    budgets = [a.max_new_tokens for a in joining]
    for prompt, budget in zip(prompts, budgets):
        if not prompt or budget < 1 or len(prompt) + budget > room:
            raise InputError(f"a joining row needs a non-empty prompt and at least one new token within {room} "
                             f"positions (got a prompt of {len(prompt)} and a budget of {budget}); admit only "
                             "rows that fit the room `admit` is given")
    drafter, K = proposer.drafter, proposer.block_size
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


def generate(target: Target, proposer: Proposer, prompts: list[list[int]], *, max_new_tokens=256,
             stop_token_ids=None, selector: Selector | None = None,
             on_tokens: Callable[[int, list[int]], None] | None = None) -> list[GenerationResult]:
    """Decode every prompt to completion as one batch (`stream`); one GenerationResult per prompt, in order, each
    with its statistics (tokens per second over the batch's wall time). `on_tokens(row, tokens)` sees the tokens
    as they are committed."""
    stats = [AcceptanceStats(proposer.block_size) for _ in prompts]
    tokens: list[list[int]] = [[] for _ in prompts]
    reasons: list[str] = ["length"] * len(prompts)
    start = time.perf_counter()
    for event in stream(target, proposer, prompts, max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids,
                        selector=selector, stats=stats):
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


def _as_list(budget, count: int) -> list[int]:
    return list(budget) if isinstance(budget, (list, tuple)) else [budget] * count
