"""Run every method on every batch of prompts, interleaved, and record one row per (batch, method).

Fairness rules, all in this module:
1. One process, one set of target weights for every method.
2. A warm-up run of every method on the first batch before any timing, so no method pays first-call costs.
3. Interleaved: for each batch, every method runs before the next batch starts, and the order rotates by one
   per batch (batch i starts with method i mod M), so machine drift and cache warmth hit all methods alike. With
   `rounds` > 1 every method decodes each batch that many times, the order rotating by one more each round, and
   the batch's time is the median of its rounds (a spell of another job on a shared machine then moves one round).
4. Greedy everywhere (or, with `sampling`, every method sampling with the same parameters), the same
   `max_new_tokens` and the same stop tokens; tokens are truncated by one rule (`trim`) before counting, so
   only new tokens up to and including the first stop token count. Sampled texts are compared only when ours
   sample coupled (`coupled`: the same seeds give the target-alone sample); otherwise each method draws its own
   sample, and only their distributions agree.
5. On CUDA the clock reads after a synchronize on both sides, so queued kernels are inside the timing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..decode.requests import check_request
from ..metrics import AcceptanceStats
from ..model.target import Target
from ..sampling import SamplingParams

WARMUP_MAX_NEW_TOKENS = 16  # enough to reach steady-state decode steps; short enough to cost seconds


@dataclass(frozen=True)
class BenchSettings:
    block_size: int
    max_new_tokens: int
    batch_size: int = 1
    warmup: bool = True
    methods: tuple[str, ...] | None = None  # the methods to run (methods.METHODS); None: all that can run here
    sampling: SamplingParams | None = None  # None or temperature 0: greedy; else every method samples (rule 4)
    coupled: bool = False  # ours sample coupled (sampling/gumbel.py), so their texts compare to ours-baseline's
    llama_draft_max: tuple[int, ...] = (2,)  # llama.cpp DFlash's draft lengths, one method each (methods.py)
    measure_costs: bool = False  # time ours' step costs afresh (in the warm-up) instead of reading the cache
    rounds: int = 1  # decodes of each batch by each method; its seconds: the median (rule 3)


@dataclass
class BenchRun:
    """Everything measured: rows in run order, and per method the truncated tokens and stats of each prompt."""

    methods: list[str]
    prompt_ids: list[str]
    rows: list[dict] = field(default_factory=list)
    tokens: dict[str, list[list[int] | None]] = field(default_factory=dict)  # method -> per prompt
    stats: dict[str, list[AcceptanceStats]] = field(default_factory=dict)  # speculative methods only


def interleaved_order(names: Sequence[str], index: int) -> list[str]:
    """Method order for batch `index`: the base order rotated left by `index` (rule 3)."""
    shift = index % len(names)
    return list(names[shift:]) + list(names[:shift])


def batches(count: int, size: int) -> list[list[int]]:
    """Prompt indices grouped in file order into batches of `size` (the last one may be shorter)."""
    return [list(range(start, min(start + size, count))) for start in range(0, count, size)]


def trim(tokens: Sequence[int], stop_token_ids, max_new_tokens: int) -> list[int]:
    """New tokens up to and including the first stop token, at most `max_new_tokens` (rule 4).

    HF's batched generate pads finished rows after their stop token; those pads must not count.
    """
    kept = list(tokens[:max_new_tokens])
    for i, token in enumerate(kept):
        if token in stop_token_ids:
            return kept[: i + 1]
    return kept


def timed(device: torch.device, fn: Callable):
    """(fn(), wall seconds), synchronizing CUDA before and after (rule 5)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if cuda:
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


def run_bench(target: Target, methods: list, prompts: list[list[int]], settings: BenchSettings,
              stop_token_ids: Sequence[int], prompt_ids: Sequence[str] | None = None,
              on_progress: Callable[[int, int, str], None] | None = None) -> BenchRun:
    """Decode `prompts` (token ids) with every method, interleaved per batch; returns the measured rows.

    `on_progress(done, total, description)` is called after the warm-up and after each (batch, method) run.
    """
    # Every prompt is checked against the context length before minutes of decoding, not at prompt 37.
    check_request(target, prompts, settings.max_new_tokens, settings.block_size, None)
    names = [m.name for m in methods]
    labels = list(prompt_ids) if prompt_ids is not None else [str(i) for i in range(len(prompts))]
    run = BenchRun(names, labels, tokens={n: [None] * len(prompts) for n in names})
    groups = batches(len(prompts), settings.batch_size)
    total, done = int(settings.warmup) + len(groups) * len(methods) * settings.rounds, 0
    if settings.warmup:
        warm = [prompts[i] for i in groups[0]]
        for method in methods:
            method.decode(warm, min(settings.max_new_tokens, WARMUP_MAX_NEW_TOKENS))
        done += 1
        if on_progress:
            on_progress(done, total, "warm-up")
    by_name = {m.name: m for m in methods}
    stops = set(stop_token_ids)
    for index, group in enumerate(groups):
        batch = [prompts[i] for i in group]
        rows, seconds_of = {}, {name: [] for name in names}  # the first round's row of each method, every round's time
        for round_ in range(settings.rounds):
            for position, name in enumerate(interleaved_order(names, index + round_)):
                decoded, seconds = timed(target.device, lambda: by_name[name].decode(batch, settings.max_new_tokens))
                seconds_of[name].append(seconds)
                if round_ == 0:  # tokens and stats of the first round (greedy: every round's are the same)
                    rows[name] = _first_round(run, name, index, position, group, labels, decoded, stops, settings)
                done += 1
                if on_progress:
                    on_progress(done, total, f"batch {index + 1}/{len(groups)} {name}")
        for name, row in rows.items():  # in the first round's order
            seconds = statistics.median(seconds_of[name])
            row.update(seconds=seconds, tokens_per_second=sum(row["new_tokens"]) / seconds if seconds > 0 else 0.0)
            if settings.rounds > 1:
                row["round_seconds"] = seconds_of[name]
            run.rows.append(row)
    return run


def _first_round(run: BenchRun, name: str, index: int, position: int, group: list[int], labels: list[str], decoded,
                 stops: set, settings: BenchSettings) -> dict:
    """Keep a method's first decode of batch `index` (its tokens, truncated, and stats) in `run`; its row."""
    kept = [trim(d.tokens, stops, settings.max_new_tokens) for d in decoded]
    for i, tokens in zip(group, kept):
        run.tokens[name][i] = tokens
    spec_stats = [d.stats for d in decoded if d.stats is not None]
    if spec_stats:
        run.stats.setdefault(name, []).extend(spec_stats)
    return {"batch": index, "method": name, "order": position, "prompts": [labels[i] for i in group],
            "new_tokens": [len(t) for t in kept]}
