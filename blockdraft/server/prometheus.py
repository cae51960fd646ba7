"""The server's counters, rendered in the Prometheus text exposition format (version 0.0.4) by hand.

Four families of numbers: HTTP requests (by route and status, with a latency histogram), tokens (prompt and
completion), decode batches (with the queue and the rows decoding now), and acceptance. Acceptance pools every
row of every batch into one `AcceptanceStats`, so `blockdraft_tau` is the histogram of tau over 1..K (steps past
K only in +Inf) with `_sum` = returned tokens and `_count` = verify steps: `_sum / _count` is the pooled mean
tau, bonus included (blockdraft.metrics).
Routes outside the served set are counted as "other", so a scan of random paths cannot grow the label set.
"""

from __future__ import annotations

import threading
from collections import Counter

from ..metrics import AcceptanceStats

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


class _Histogram:
    def __init__(self, bounds) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * len(self.bounds)  # counts[i]: observations <= bounds[i] and > bounds[i - 1]
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        sep = "," if labels else ""
        out, cumulative = [], 0
        for bound, n in zip(self.bounds, self.counts):
            cumulative += n
            out.append(f'{name}_bucket{{{labels}{sep}le="{_number(bound)}"}} {cumulative}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        braces = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{braces} {_number(self.total)}", f"{name}_count{braces} {self.count}"]
        return out


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class ServerMetrics:
    """Thread-safe: the event loop records requests, the worker thread records batches."""

    def __init__(self, block_size: int) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.latency: dict[str, _Histogram] = {}
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.batches = 0
        self.batch_rows = _Histogram((1, 2, 4, 8, 16, 32, 64, 128))
        self.acceptance = AcceptanceStats(block_size)

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        route = path if path in ROUTES else "other"
        with self._lock:
            self.requests[(route, status)] += 1
            self.latency.setdefault(route, _Histogram(LATENCY_BUCKETS)).observe(seconds)

    def add_tokens(self, prompt: int, completion: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.completion_tokens += completion

    def add_batch(self, rows: int, stats: AcceptanceStats) -> None:
        with self._lock:
            self.batches += 1
            self.batch_rows.observe(rows)
            self.acceptance = self.acceptance.merge(stats)

    def render(self, queue_depth: int, active_rows: int) -> str:
        with self._lock:
            lines = _family("blockdraft_requests_total", "counter", "HTTP requests by route and status code.")
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'blockdraft_requests_total{{route="{route}",status="{status}"}} {n}')
            lines += _family("blockdraft_request_duration_seconds", "histogram",
                             "Time from request to the last byte of the response (the whole stream).")
            for route, histogram in sorted(self.latency.items()):
                lines += histogram.lines("blockdraft_request_duration_seconds", f'route="{route}"')
            lines += _family("blockdraft_tokens_total", "counter", "Tokens by kind: prompt or completion.")
            lines += [f'blockdraft_tokens_total{{kind="prompt"}} {self.prompt_tokens}',
                      f'blockdraft_tokens_total{{kind="completion"}} {self.completion_tokens}']
            lines += _family("blockdraft_queue_depth", "gauge", "Requests waiting for the next batch.")
            lines.append(f"blockdraft_queue_depth {queue_depth}")
            lines += _family("blockdraft_active_rows", "gauge", "Rows the running batch decodes; a row whose client "
                             "left or timed out leaves it at the next step.")
            lines.append(f"blockdraft_active_rows {active_rows}")
            lines += _family("blockdraft_batch_rows", "histogram", "Requests decoded together in one batch.")
            lines += self.batch_rows.lines("blockdraft_batch_rows", "")
            lines += self._acceptance_lines()
        return "\n".join(lines) + "\n"

    def _acceptance_lines(self) -> list[str]:
        stats = self.acceptance
        lines = _family("blockdraft_tau", "histogram",
                        "Tokens committed per verify step (tau, bonus included) over 1..K, all rows pooled.")
        tau = _Histogram(range(1, stats.block_size + 1))
        tau.counts, tau.total, tau.count = list(stats.histogram), float(stats.tokens), stats.steps
        lines += tau.lines("blockdraft_tau", "")
        lines += _family("blockdraft_acceptance_rate", "gauge",
                         "Acceptance of draft proposal slot k, given the step reached it (1..K-1).")
        for k, rate in enumerate(stats.per_position_acceptance(), start=1):
            lines.append(f'blockdraft_acceptance_rate{{position="{k}"}} {_number(rate)}')
        return lines


def _family(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
