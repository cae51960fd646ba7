"""Serving statistics: pure functions from one point's request timings to its numbers (`blockdraft bench serve`).

Terms, fixed here and nowhere else (all times from one monotonic clock, in seconds; reported in ms):
- A **request** is one streamed chat completion. Its **chunks** are the stream's events that carry content;
  one chunk is one decode step's text, so a speculative step that commits several tokens sends them in one chunk.
- **TTFT** (time to first token): request sent -> first content chunk received. Queueing and prefill are in it.
- **ITL** (inter-token latency): the time between two consecutive content chunks of a request, pooled over all
  requests of a point (as vLLM's `bench serve` pools them). For the target alone a chunk is one token; for the
  speculative server it is one step, which may carry several: compare modes by TPOT, not ITL.
- **TPOT** (time per output token): (last chunk - first chunk) / (completion tokens - 1) of one request: the
  pace of its answer once it has started. Completion tokens come from the stream's final `usage` chunk
  (`stream_options.include_usage`), or, from a server that sends none, from the count of chunks.
- **Per-user tok/s**: the median over requests of 1 / TPOT: how fast one user sees the answer stream, queueing
  and prefill left out (TTFT shows those). Requests of fewer than 2 tokens have no TPOT and are left out.
- **Total tok/s**: the completion tokens of all completed requests / the point's wall time (first request sent
  to last request ended): what the server delivers to everyone together.
- **End-to-end latency**: request sent -> last byte of the stream.
- **Rounds** (`--repeats`): a point runs R rounds per mode, interleaved. A round's **x target alone** is its total
  tok/s over the target alone's in the same round; a point's numbers over rounds are the **median** (and the
  min-max range) of its rounds' numbers, its ratio the median of the rounds' ratios.
- An **error** is a request answered with a non-200 status (429, 5xx, ...), a stream that ended with an error
  event or without `data: [DONE]`, or a connection failure; it counts by kind and enters no timing.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 99)


@dataclass
class RequestTiming:
    """One request as the client saw it (monotonic seconds)."""

    start: float  # the request was sent
    end: float  # its stream ended (or it failed)
    chunk_times: list[float] = field(default_factory=list)  # each content chunk's arrival, in order
    completion_tokens: int = 0
    error: str | None = None  # None: completed; else its kind: "429", "500", "stream", "transport", ...
    message: str = ""  # the error's text, cut short, for the report

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tpot(self) -> float | None:
        """Seconds per token after the first; None below 2 tokens (or with no time between them to divide)."""
        if self.completion_tokens < 2 or len(self.chunk_times) < 2:
            return None  # one chunk holding every token: no pace was seen, only a single arrival
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.completion_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default);
    None for no values. E.g. [1, 2, 3, 4] at q=50: rank 1.5 -> 2.5."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must lie in [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentiles_ms(seconds: Sequence[float]) -> dict[str, float | None]:
    """{"p50", "p90", "p99"} of `seconds`, in milliseconds, rounded to 0.01 ms."""
    return {f"p{q}": _round(None if (v := percentile(seconds, q)) is None else v * 1000, 2) for q in PERCENTILES}


def per_user_rate(timings: Sequence[RequestTiming]) -> float | None:
    """Median over completed requests of 1 / TPOT, tokens/s (module docstring); None when none has a TPOT."""
    rates = [1 / t.tpot for t in timings if t.ok and t.tpot]
    return statistics.median(rates) if rates else None


def total_rate(timings: Sequence[RequestTiming], wall_seconds: float) -> float:
    """All completed requests' completion tokens / the point's wall time, tokens/s."""
    tokens = sum(t.completion_tokens for t in timings if t.ok)
    return tokens / wall_seconds if wall_seconds > 0 else 0.0


def wall_time(timings: Sequence[RequestTiming]) -> float:
    """First request sent to last request ended, seconds; 0 for no requests."""
    return max(t.end for t in timings) - min(t.start for t in timings) if timings else 0.0


def summarize_point(timings: Sequence[RequestTiming], wall_seconds: float, unfinished: int = 0) -> dict:
    """The numbers of one point of one mode: counts, latency percentiles in ms, per-user and total tok/s.

    `unfinished`: requests never sent or cancelled at the point's time limit; they enter no number but the count.
    """
    done = [t for t in timings if t.ok]
    errors = Counter(t.error for t in timings if not t.ok)
    chunks = sum(len(t.chunk_times) for t in done)
    tokens = sum(t.completion_tokens for t in done)
    per_user = per_user_rate(done)
    return {
        "requests": len(timings) + unfinished,
        "completed": len(done),
        "errors": sum(errors.values()),
        "error_kinds": dict(sorted(errors.items())),
        "first_errors": list(dict.fromkeys(t.message for t in timings if not t.ok))[:3],
        "unfinished": unfinished,
        "completion_tokens": tokens,
        "tokens_per_chunk": _round(tokens / chunks if chunks else None, 3),
        "wall_s": round(wall_seconds, 3),
        "total_tok_s": round(total_rate(done, wall_seconds), 3),
        "per_user_tok_s": _round(per_user, 3),
        "ttft_ms": percentiles_ms([t.ttft for t in done if t.ttft is not None]),
        "itl_ms": percentiles_ms([gap for t in done for gap in t.itls]),
        "tpot_ms": percentiles_ms([t.tpot for t in done if t.tpot]),
        "e2e_ms": percentiles_ms([t.end - t.start for t in done]),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, rounded to 0.001; None where either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


ROUND_NUMBERS = {  # what is summarized over rounds: name -> the round's value
    "total_tok_s": lambda r: r["total_tok_s"], "per_user_tok_s": lambda r: r["per_user_tok_s"],
    "ttft_p50_ms": lambda r: r["ttft_ms"]["p50"], "vs_target_alone": lambda r: r.get("vs_target_alone"),
    "mean_tau": lambda r: r.get("mean_tau")}


def over_rounds(records: list[dict]) -> list[dict]:
    """One entry per (point, mode) of the rounds' records, in first-seen order: for each of ROUND_NUMBERS the
    median over the rounds that have it and its [min, max] range (None where no round has it), the rounds, and
    the requests completed and sent over all of them."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["point"], r["mode"]), []).append(r)
    out = []
    for (point, mode), rounds in groups.items():
        entry = {"point": point, "mode": mode, "rounds": len(rounds),
                 "completed": sum(r["completed"] for r in rounds), "requests": sum(r["requests"] for r in rounds),
                 "errors": sum(r["errors"] for r in rounds), "cut_short": any(r["cut_short"] for r in rounds)}
        for name, of in ROUND_NUMBERS.items():
            values = [of(r) for r in rounds if of(r) is not None]
            entry[name] = round(statistics.median(values), 3) if values else None
            entry[f"{name}_range"] = [min(values), max(values)] if values else None
        out.append(entry)
    return out
