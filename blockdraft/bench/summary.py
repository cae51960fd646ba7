"""Summary statistics of a benchmark run: pure functions from measured rows to numbers.

Conventions, fixed here and nowhere else:
- A **measurement** is one method decoding one batch of prompts (one prompt at the default batch size 1).
  Its throughput is new tokens / wall seconds, prefill included; new tokens are counted after the same
  stop-token and length truncation for every method (runner.trim).
- The **spread** of a method is over its measurements: median, min, max and the quartiles q1, q3.
- A **speedup** is paired: in each batch, the method's throughput over the reference method's throughput in
  that same batch (measured minutes apart at most, since methods are interleaved per batch); the reported
  speedup is the spread of those ratios. Pairing cancels the drift a slow machine shows between batches.
- Acceptance (tau) is owned by AcceptanceStats; this module only merges per-batch stats.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ..metrics import AcceptanceStats


def spread(values: Sequence[float]) -> dict | None:
    """Median, min, max and quartiles of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        q1 = q3 = ordered[0]
    else:
        # "inclusive" keeps quartiles inside [min, max] for small samples (the default can step outside).
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1], "q1": q1, "q3": q3,
            "n": len(ordered)}


def paired_ratios(numerator: dict[int, float], denominator: dict[int, float]) -> list[float]:
    """Per-batch ratios numerator[b] / denominator[b] over the batches both measured (zero denominators skipped)."""
    return [numerator[b] / denominator[b] for b in sorted(numerator) if denominator.get(b)]


def first_difference(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first token where `other` departs from `reference` (a length difference counts); None if equal."""
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def summarize_method(rows: list[dict], reference_rates: dict[str, dict[int, float]]) -> dict:
    """Throughput spread, paired speedups and token totals of one method's rows (see the module docstring).

    `reference_rates` maps each reference method name to its {batch: tokens/s}; a method compared with itself
    gets a speedup of exactly 1 per batch, which keeps the table uniform.
    """
    rates = {row["batch"]: row["tokens_per_second"] for row in rows}
    summary = {
        "tokens_per_second": spread(list(rates.values())),
        "new_tokens": sum(sum(row["new_tokens"]) for row in rows),
        "seconds": sum(row["seconds"] for row in rows),
    }
    for name, reference in reference_rates.items():
        key = "speedup_vs_" + name.replace("-", "_")
        summary[key] = spread(paired_ratios(rates, reference)) if reference else None
    return summary


def merged_acceptance(stats: Sequence[AcceptanceStats], new_tokens: int, seconds: float) -> AcceptanceStats | None:
    """All steps of a speculative method pooled into one AcceptanceStats, timed by the bench's own clock.

    The decode loop stamps every row of a batch with the batch's elapsed time, so summing its `seconds`
    would count a batch B times; the measured totals replace them.
    """
    if not stats:
        return None
    pooled = AcceptanceStats(stats[0].block_size)  # one K per run: merge refuses another
    for s in stats:
        pooled = pooled.merge(s)
    pooled.new_tokens, pooled.seconds = new_tokens, seconds
    return pooled
