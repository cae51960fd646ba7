"""Acceptance statistics: the one place that fixes how tau is counted.

Convention: one verify step of one row commits `a + 1` tokens, the `a` accepted draft proposals plus the
target's own token (the bonus, or the replacement at the first rejection). tau = a + 1 lies in [1, K], and
mean tau counts the bonus. Pooled mean tau = committed tokens / verify steps over all rows and prompts;
it is the headline number. Per-position acceptance at slot k (1..K-1) = P(proposal k accepted | the step
got to propose k), i.e. steps with tau > k over steps that reached slot k (tau >= k) with a block that had it.

A step may verify fewer than K slots (an adaptive width; width 1 is a plain target step that proposes
nothing): tau still counts its tokens, the histogram its tau, and `plain_steps` how many proposed nothing.
`lookup_steps` counts the steps whose proposals came from a prompt lookup (decode/lookup.py), alone or grafted
onto the draft's token tree: tau and the per-position rates pool both sources. A lookup block may be wider than
the draft's K (it is not bounded by the draft's slots); the first step that commits more than K tokens extends
the histogram and the per-position rates to its width, and `block_size` with them.
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
    slot_reached: list[int] = field(default_factory=list)  # [K-1]: steps that reached slot k = 1..K-1
    slot_accepted: list[int] = field(default_factory=list)  # [K-1]: steps that accepted slot k
    plain_steps: int = 0  # steps of width 1: no proposal, the target's own step
    lookup_steps: int = 0  # steps that verified a prompt-lookup block, alone or grafted onto a tree

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * self.block_size
        if not self.slot_reached:
            self.slot_reached = [0] * (self.block_size - 1)
            self.slot_accepted = [0] * (self.block_size - 1)

    def record(self, tau: int, width: int | None = None, lookup: bool = False) -> None:
        """Count one verify step of one row that committed `tau` tokens from a block of `width` slots
        (anchor included; None: the full block), proposed by a prompt lookup when `lookup`."""
        width = self.block_size if width is None else width
        if max(tau, width) > self.block_size:  # a lookup block wider than the draft's K
            self._grow(max(tau, width))
        self.histogram[tau - 1] += 1
        self.tokens += tau
        self.plain_steps += width == 1
        self.lookup_steps += lookup and width > 1
        for k in range(1, min(tau, width - 1) + 1):  # slots 1..min(tau, w-1) were reached
            self.slot_reached[k - 1] += 1
            self.slot_accepted[k - 1] += tau > k

    def _grow(self, size: int) -> None:
        self.histogram += [0] * (size - self.block_size)
        self.slot_reached += [0] * (size - self.block_size)
        self.slot_accepted += [0] * (size - self.block_size)
        self.block_size = size

    def merge(self, other: "AcceptanceStats") -> "AcceptanceStats":
        size = max(self.block_size, other.block_size)

        def add(a: list[int], b: list[int], n: int) -> list[int]:
            return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]

        return AcceptanceStats(
            size, add(self.histogram, other.histogram, size), self.tokens + other.tokens,
            self.seconds + other.seconds, self.new_tokens + other.new_tokens,
            add(self.slot_reached, other.slot_reached, size - 1),
            add(self.slot_accepted, other.slot_accepted, size - 1),
            self.plain_steps + other.plain_steps, self.lookup_steps + other.lookup_steps,
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
        return [a / r if r else 0.0 for a, r in zip(self.slot_accepted, self.slot_reached)]

    def as_dict(self) -> dict:
        return {
            "block_size": self.block_size,
            "mean_tau": round(self.mean_tau, 4),
            "steps": self.steps,
            "tau_histogram": list(self.histogram),
            "per_position_acceptance": [round(r, 4) for r in self.per_position_acceptance()],
            "plain_steps": self.plain_steps,
            "lookup_steps": self.lookup_steps,
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
        }
