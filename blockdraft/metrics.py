"""Acceptance statistics: the one place that fixes how tau is counted.

Convention: one verify step of one row commits `a + 1` tokens, the `a` accepted draft proposals plus the
target's own token (the bonus, or the replacement at the first rejection). tau = a + 1 lies in [1, K], and
mean tau counts the bonus. Pooled mean tau = committed tokens / verify steps over all rows and prompts;
it is the headline number. Per-position acceptance at slot k (1..K-1) = P(proposal k accepted | the step
got to propose k), i.e. steps with tau > k over steps whose block had slot k.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptanceStats:
    block_size: int
    histogram: list[int] = field(default_factory=list)  # histogram[t - 1] = steps with tau == t, t in 1..K
    tokens: int = 0  # committed tokens counted toward tau (bonus included)
    seconds: float = 0.0  # wall time of the decode, prefill included
    new_tokens: int = 0  # tokens returned to the caller (after stop/budget truncation)

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * self.block_size

    def record(self, tau: int) -> None:
        """Count one verify step of one row that committed `tau` tokens."""
        self.histogram[tau - 1] += 1
        self.tokens += tau

    def merge(self, other: "AcceptanceStats") -> "AcceptanceStats":
        size = max(self.block_size, other.block_size)
        hist = [0] * size
        for source in (self.histogram, other.histogram):
            for i, n in enumerate(source):
                hist[i] += n
        return AcceptanceStats(
            size, hist, self.tokens + other.tokens, self.seconds + other.seconds, self.new_tokens + other.new_tokens
        )

    @property
    def steps(self) -> int:
        return sum(self.histogram)

    @property
    def mean_tau(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def per_position_acceptance(self) -> list[float]:
        """Acceptance rate of proposal slot k = 1..K-1, conditional on reaching it."""
        rates = []
        for k in range(1, self.block_size):
            reached = sum(self.histogram[k - 1 :])  # steps with tau >= k reached slot k
            accepted = sum(self.histogram[k:])  # steps with tau > k accepted it
            rates.append(accepted / reached if reached else 0.0)
        return rates

    def as_dict(self) -> dict:
        return {
            "block_size": self.block_size,
            "mean_tau": round(self.mean_tau, 4),
            "steps": self.steps,
            "tau_histogram": list(self.histogram),
            "per_position_acceptance": [round(r, 4) for r in self.per_position_acceptance()],
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
        }
