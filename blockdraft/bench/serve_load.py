"""The load generator's HTTP side: streamed chat completions against one OpenAI-compatible server, timed per chunk.

A point of a sweep sends `requests` requests (prompts cycled in order, so every mode gets the same ones) in one of
two shapes:
- **closed loop** (`concurrency` c): c clients, each sending its next request when its last one has ended;
- **open loop** (`rate` R): requests arrive at R per second with exponential gaps (a Poisson process, seeded, so
  every mode sees the same schedule), however many are still running.
A point ends when its requests are done or at its time limit, whichever comes first; at the limit, requests still
running are cancelled and counted as unfinished, and the point is marked cut short. Failures are recorded as
errors (serve_stats.py), never raised: one refused request must not end a sweep.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx

from ..errors import ConfigError
from .serve_stats import RequestTiming, wall_time

CHAT = "/v1/chat/completions"
ARRIVAL_SEED = 0  # the open loop's arrival schedule: the same for every mode and every run
MESSAGE_CHARS = 300  # an error's text kept for the report


@dataclass(frozen=True)
class Point:
    """One point of a sweep: a concurrency level or a request rate (exactly one), and the requests it sends."""

    requests: int
    concurrency: int | None = None
    rate: float | None = None  # requests per second

    def __post_init__(self) -> None:
        # Both or neither would leave the load shape undefined; a zero would send nothing or never stop.
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError(f"a point has a concurrency or a rate, got concurrency {self.concurrency}, rate "
                             f"{self.rate}; pass exactly one")
        too_low = self.concurrency is not None and self.concurrency < 1 or self.rate is not None and not self.rate > 0
        if self.requests < 1 or too_low:
            raise ValueError(f"a point needs requests >= 1, concurrency >= 1 and rate > 0, got {self}")

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"{self.rate:g}/s"


@dataclass
class PointRun:
    """What one point measured on one server."""

    timings: list[RequestTiming]
    wall_seconds: float
    unfinished: int  # cancelled at the time limit, or never sent
    cut_short: bool  # the time limit ended the point
    mean_tau: float | None  # the server's pooled mean tau over this point (None: no speculative steps)


def client_for(url: str, api_key: str | None, time_limit: float) -> httpx.AsyncClient:
    """One connection pool per server. No connection limit: with httpx's default of 100, an open loop past 100
    requests in flight would queue inside the client, and TTFT would count that wait as the server's."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=time_limit + 30,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))


async def served_model(client: httpx.AsyncClient) -> str:
    """The id the server serves (the first of GET /v1/models): requests must name it."""
    try:
        response = await client.get("/v1/models")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as error:
        raise ConfigError(f"GET {client.base_url}/v1/models failed ({type(error).__name__}: {error}); pass the --url "
                          "of a running OpenAI-compatible server (and its --api-key, if it has one)") from error


async def stream_chat(client: httpx.AsyncClient, model: str, messages: list[dict], max_tokens: int) -> RequestTiming:
    """One greedy streamed chat completion, timed per content chunk; a failure is returned, not raised."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    timing = RequestTiming(start=time.perf_counter(), end=0.0)
    usage, done = None, False
    try:
        async with client.stream("POST", CHAT, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return _failed(timing, str(response.status_code), f"HTTP {response.status_code}: {text}")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue  # blank separators and SSE comments
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = _payload(line)
                if chunk is None:
                    return _failed(timing, "stream", f"a data line that is not a JSON object: {line[:80]}")
                if "error" in chunk:  # a stream that failed after its 200 (timeout, shutdown, decode error)
                    return _failed(timing, "stream", f"error event: {_message(chunk['error'])}")
                usage = chunk.get("usage") or usage
                if any(_content(choice) for choice in chunk.get("choices") or ()):
                    timing.chunk_times.append(time.perf_counter())
    except (httpx.HTTPError, UnicodeDecodeError) as error:
        return _failed(timing, "transport", f"{type(error).__name__}: {error}")
    if not done:
        return _failed(timing, "stream", "the stream ended without data: [DONE]")
    timing.end = time.perf_counter()
    # Without a usage chunk, one token per chunk: right for the target alone, an undercount for speculation.
    counted = usage.get("completion_tokens") if isinstance(usage, dict) else None
    timing.completion_tokens = counted if isinstance(counted, int) else len(timing.chunk_times)
    return timing


def _payload(line: str) -> dict | None:
    try:
        chunk = json.loads(line[len("data: "):])
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None


def _content(choice) -> str | None:
    delta = choice.get("delta") if isinstance(choice, dict) else None
    return delta.get("content") if isinstance(delta, dict) else None


def _message(error) -> str:
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


def _failed(timing: RequestTiming, kind: str, message: str) -> RequestTiming:
    timing.end, timing.error, timing.message = time.perf_counter(), kind, message[:MESSAGE_CHARS]
    return timing


async def run_point(client: httpx.AsyncClient, model: str, prompts: list[list[dict]], point: Point,
                    max_tokens: int, time_limit: float, on_request=None) -> PointRun:
    """Send `point.requests` requests in the point's shape (module docstring); `on_request()` after each ends."""
    timings: list[RequestTiming] = []
    before = await tau_counters(client)

    async def request(i: int) -> None:
        timings.append(await stream_chat(client, model, prompts[i % len(prompts)], max_tokens))
        if on_request is not None:
            on_request()

    tasks = _closed_loop(request, point) if point.concurrency is not None else _open_loop(request, point)
    finished, pending = await asyncio.wait(tasks, timeout=time_limit)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in finished:
        task.result()  # a bug in the loop itself surfaces here rather than as a silently short point
    wall = time_limit if pending else wall_time(timings)
    after = await settled_tau_counters(client, before)
    return PointRun(timings, wall, point.requests - len(timings), bool(pending), _mean_tau(before, after))


def _closed_loop(request, point: Point) -> list[asyncio.Task]:
    issued = iter(range(point.requests))  # shared: each client takes the next request number

    async def user() -> None:
        for i in issued:
            await request(i)

    return [asyncio.create_task(user()) for _ in range(point.concurrency)]


def _open_loop(request, point: Point) -> list[asyncio.Task]:
    gaps = random.Random(ARRIVAL_SEED)

    async def arrivals() -> None:
        sent = []
        try:
            for i in range(point.requests):
                if i:
                    await asyncio.sleep(gaps.expovariate(point.rate))
                sent.append(asyncio.create_task(request(i)))
            await asyncio.gather(*sent)
        finally:  # cancelled at the time limit: requests in flight end with it
            for task in sent:
                task.cancel()
            await asyncio.gather(*sent, return_exceptions=True)

    return [asyncio.create_task(arrivals())]


async def tau_counters(client: httpx.AsyncClient) -> tuple[float, float] | None:
    """(blockdraft_tau_sum, blockdraft_tau_count) from GET /metrics: committed tokens and verify steps so far;
    None from a server without them (another server, or /metrics unreachable)."""
    try:
        response = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    values = {}
    for line in response.text.splitlines() if response.status_code == 200 else ():
        name, _, value = line.partition(" ")
        if name in ("blockdraft_tau_sum", "blockdraft_tau_count"):
            values[name] = float(value)
    return (values["blockdraft_tau_sum"], values["blockdraft_tau_count"]) if len(values) == 2 else None


async def settled_tau_counters(client: httpx.AsyncClient, before: tuple[float, float] | None,
                               wait: float = 5.0) -> tuple[float, float] | None:
    """`tau_counters` once the point's last batch is in them: a server adds a batch's steps after the decode loop
    ends, just after its last row's final event, so a reading taken as the last response arrives can miss them
    (seen on a busy 2-core machine: no steps at all for a point of two requests). Reads again every 50 ms, for at
    most `wait` seconds, until the step count has moved past `before`'s."""
    after = await tau_counters(client)
    deadline = time.perf_counter() + wait
    while after is not None and before is not None and after[1] <= before[1] and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
        after = await tau_counters(client)
    return after


def _mean_tau(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """Mean tau (bonus counted) of the steps between two readings: the point's own, not the server's lifetime."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)
