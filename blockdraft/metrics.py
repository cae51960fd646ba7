"""Acceptance statistics: the one place that fixes how tau is counted.

Convention: one verify step of one row commits `a + 1` tokens, the `a` accepted draft proposals plus the
target's own token (the bonus, or the replacement at the first rejection). tau counts the step's tokens that
are returned to the caller: where the token budget or a stop token cuts the last step of a row, only the tokens
before the cut count, as the reference runtime and transformers count them. Mean tau counts the bonus: pooled
mean tau = returned tokens / verify steps over all rows and prompts (the prefill's first token is no step), and
it is the headline number. Per-position acceptance at slot k (1..K-1) = P(proposal k accepted | the step got to
propose k), i.e. steps that accepted slot k over steps whose returned tokens reached slot k (tau >= k) with a
block that had it.

The histogram has K + 1 bins for every run at block size K, whatever its steps did: tau = 1..K, then one
overflow bin ">K" (`tau_bins`) for steps that commit more than K tokens. Only a prompt-lookup block
(decode/lookup.py, up to 2K wide), alone or grafted onto a token tree, can: the draft guesses K-1 slots deep, in
a chain or a tree. Stats of one K therefore merge bin for bin, and every row and method of a run prints the same
bins, however wide its steps were. Per-position rates cover the draft's slots 1..K-1 only; a lookup's slots
past them show in tau and in the overflow bin.

A step may verify fewer than K slots (an adaptive width; width 1 is a plain target step that proposes
nothing): tau still counts its tokens, the histogram its tau, and `plain_steps` how many proposed nothing.
`lookup_steps` counts the steps whose proposals came from a prompt lookup, alone or grafted onto the draft's
token tree: tau and the per-position rates pool both sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def tau_bins(block_size: int) -> list[str]:
    """Labels of the K + 1 histogram bins at block size K: "1".."K", then ">K" (steps wider than the block)."""
    return [str(t) for t in range(1, block_size + 1)] + [f">{block_size}"]


@dataclass
class AcceptanceStats:
    block_size: int  # K as the decode was asked for: it fixes the bins, whatever width the steps verified
    histogram: list[int] = field(default_factory=list)  # [K + 1]: [t - 1] = steps with tau == t; [K]: tau > K
    tokens: int = 0  # returned tokens counted toward tau (bonus included, the prefill's token not)
    seconds: float = 0.0  # wall time of the decode, prefill included
    new_tokens: int = 0  # tokens returned to the caller (after stop/budget truncation)
    slot_reached: list[int] = field(default_factory=list)  # [K-1]: steps that reached slot k = 1..K-1
    slot_accepted: list[int] = field(default_factory=list)  # [K-1]: steps that accepted slot k
    plain_steps: int = 0  # steps of width 1: no proposal, the target's own step
    lookup_steps: int = 0  # steps that verified a prompt-lookup block, alone or grafted onto a tree

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.block_size + 1)
        if not self.slot_reached:
            self.slot_reached = [0] * (self.block_size - 1)
            self.slot_accepted = [0] * (self.block_size - 1)
        # Bins of another shape would merge or print misaligned with every other row of the run.
        if len(self.histogram) != self.block_size + 1 or len(self.slot_reached) != self.block_size - 1:
            raise ValueError(f"AcceptanceStats(K={self.block_size}) needs {self.block_size + 1} histogram bins and "
                             f"{self.block_size - 1} slots, got {len(self.histogram)} and {len(self.slot_reached)}; "
                             "build it from the block size alone")

    def record(self, tau: int, width: int | None = None, lookup: bool = False, committed: int | None = None) -> None:
        """Count one verify step of one row that returned `tau` tokens (>= 1) from a block of `width` slots
        (anchor included; None: the full block), proposed by a prompt lookup when `lookup`. `committed` is how
        many tokens the step accepted before the budget or a stop token cut it (None: `tau`, no cut): a slot
        whose token was returned counts as accepted when the step accepted it, even where the cut came next."""
        width = self.block_size if width is None else width
        committed = tau if committed is None else committed
        self.histogram[min(tau, self.block_size + 1) - 1] += 1  # tau > K lands in the overflow bin
        self.tokens += tau
        self.plain_steps += width == 1
        self.lookup_steps += lookup and width > 1
        # Slots 1..min(tau, w-1) were reached within the returned tokens; only the draft's K-1 are broken out.
        for k in range(1, min(tau, width - 1, self.block_size - 1) + 1):
            self.slot_reached[k - 1] += 1
            self.slot_accepted[k - 1] += committed > k

    def merge(self, other: "AcceptanceStats") -> "AcceptanceStats":
        # Another K's bins mean other taus: adding them bin for bin would mislabel every count.
        if other.block_size != self.block_size:
            raise ValueError(f"cannot merge acceptance stats of K={other.block_size} into K={self.block_size}; "
                             "pool stats of one block size")

        def add(a: list[int], b: list[int]) -> list[int]:
            return [x + y for x, y in zip(a, b)]

        return AcceptanceStats(
            self.block_size, add(self.histogram, other.histogram), self.tokens + other.tokens,
            self.seconds + other.seconds, self.new_tokens + other.new_tokens,
            add(self.slot_reached, other.slot_reached), add(self.slot_accepted, other.slot_accepted),
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

    def histogram_text(self) -> str:
        """The histogram with its bins named, e.g. "1:3 2:0 3:5 4:1 >4:2" at K=4."""
        return " ".join(f"{label}:{n}" for label, n in zip(tau_bins(self.block_size), self.histogram))

    def per_position_acceptance(self) -> list[float]:
        """Acceptance rate of proposal slot k = 1..K-1, conditional on reaching it."""
        return [a / r if r else 0.0 for a, r in zip(self.slot_accepted, self.slot_reached)]

    def as_dict(self) -> dict:
        return {
            "block_size": self.block_size,
            "mean_tau": round(self.mean_tau, 4),
            "steps": self.steps,
            "tau_bins": tau_bins(self.block_size),
            "tau_histogram": list(self.histogram),
            "per_position_acceptance": [round(r, 4) for r in self.per_position_acceptance()],
            "plain_steps": self.plain_steps,
            "lookup_steps": self.lookup_steps,
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
        }
