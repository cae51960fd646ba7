"""A load sweep over servers: every point on every server, interleaved, one record per (point, mode).

Fairness rules, all in this module:
1. Every server first answers one short warm-up request, untimed.
2. Interleaved: a round runs every point on every mode, each point's modes one after the other in an order
   rotated by one per point and per round (runner.interleaved_order), so machine drift hits every mode alike;
   `repeats` rounds. One mode runs at a time: two servers on one machine loaded together would share its cores.
3. Fresh servers every round, started in an order rotated by one per round, where the bench starts them
   (`servers` a callable): on a 2-core CPU a server started first served 2-3 % more tokens a second than an
   identical one started after it (two `--no-spec` servers and a default one in rotation, docs/history.md §6),
   as much as the difference the bench is there to measure at wide batches. Servers given by URL stay as they
   are.
4. The same requests everywhere: prompts cycled in the same order, greedy, the same `max_tokens`, and in the
   open loop the same seeded arrival schedule (serve_load.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from .runner import interleaved_order
from .serve_load import Point, client_for, run_point, served_model, stream_chat
from .serve_servers import Endpoint
from .serve_stats import summarize_point

WARMUP_MAX_TOKENS = 8  # a few decode steps: past first-call costs, seconds at most


@dataclass(frozen=True)
class SweepSettings:
    points: tuple[Point, ...]
    max_tokens: int
    time_limit: float  # seconds per point, mode and round
    repeats: int = 1  # rounds of every point and mode: a point's spread (a few %) against the modes' difference

    def __post_init__(self) -> None:
        # An empty sweep or a zero budget would measure nothing and report it as a result.
        if not self.points:
            raise ValueError("a sweep needs at least one point; pass --concurrency or --request-rate values")
        if self.repeats < 1 or isinstance(self.repeats, bool):
            raise ValueError(f"repeats must be a whole number >= 1, got {self.repeats!r}; pass --repeats 3")
        if self.max_tokens < 1 or not self.time_limit > 0:
            raise ValueError(f"max_tokens must be >= 1 and time_limit > 0 s, got {self.max_tokens} and "
                             f"{self.time_limit}; pass --max-tokens and --time-limit values above 0")


Servers = list[Endpoint] | Callable[[int], AbstractContextManager[list[Endpoint]]]


def sweep(servers: Servers, prompts: list[list[dict]], settings: SweepSettings, api_key: str | None = None,
          on_progress: Callable[[int, int, str], None] | None = None) -> list[dict]:
    """Run the sweep (rules above) and return its records in run order: each point's settings, the round
    (`repeat`, from 1), the mode, the served model, whether the time limit cut it short, the mean tau over the
    point, and serve_stats' numbers. `servers`: the endpoints of every round, or `servers(round)`, a context
    manager that starts a round's servers and stops them after it (rule 3)."""
    return asyncio.run(_sweep(servers, prompts, settings, api_key, on_progress or (lambda *_: None)))


async def _sweep(servers: Servers, prompts, settings: SweepSettings, api_key, on_progress) -> list[dict]:
    fresh = servers if callable(servers) else (lambda _round: nullcontext(servers))
    progress, records = _Progress(on_progress), []
    for repeat in range(1, settings.repeats + 1):
        if callable(servers):
            progress.say(f"round {repeat}: starting the servers (the first start on a machine measures step costs: "
                         "minutes)")
        with fresh(repeat) as endpoints:  # 3. fresh servers where the bench starts them
            progress.total = sum(p.requests for p in settings.points) * len(endpoints) * settings.repeats
            records += await _round(endpoints, repeat, prompts, settings, api_key, progress)
    return records


async def _round(endpoints: list[Endpoint], repeat: int, prompts, settings: SweepSettings, api_key,
                 progress: "_Progress") -> list[dict]:
    """One round on `endpoints`: each server warmed up (rule 1), then every point on every mode (rule 2)."""
    clients = {e.label: client_for(e.url, api_key, settings.time_limit) for e in endpoints}
    try:
        models = {}
        for label, client in clients.items():
            progress.say(f"warm-up: {label}")
            models[label] = await served_model(client)
            # A failed warm-up is not an error of the sweep: the point's requests fail likewise and are counted.
            await stream_chat(client, models[label], prompts[0], min(WARMUP_MAX_TOKENS, settings.max_tokens))
        records = []
        for index, point in enumerate(settings.points):
            for label in interleaved_order(list(clients), repeat - 1 + index):
                text = f"{point.label}: {label}" + (f" ({repeat}/{settings.repeats})" if settings.repeats > 1 else "")
                progress.say(text)
                run = await run_point(clients[label], models[label], prompts, point, settings.max_tokens,
                                      settings.time_limit, on_request=lambda text=text: progress.advance(text))
                progress.advance(text, run.unfinished)  # the bar counts what the time limit left out as passed
                records.append({"point": point.label, "concurrency": point.concurrency, "rate": point.rate,
                                "repeat": repeat, "mode": label, "model": models[label], "cut_short": run.cut_short,
                                "mean_tau": run.mean_tau,
                                **summarize_point(run.timings, run.wall_seconds, run.unfinished)})
        return records
    finally:
        await asyncio.gather(*(client.aclose() for client in clients.values()))


@dataclass
class _Progress:
    """The sweep's requests done of all, passed on to `on_progress(done, total, text)`."""

    report: Callable[[int, int, str], None]
    total: int = 0
    done: int = 0

    def say(self, text: str) -> None:
        self.report(self.done, self.total, text)

    def advance(self, text: str, requests: int = 1) -> None:
        self.done += requests
        self.report(self.done, self.total, text)
