"""How many draft proposals each step verifies: a fixed block, or the width that pays best.

A step of width w verifies the anchor plus w-1 proposals in one target forward (w = 1: no proposal, a
plain target step; the target still taps its features, which wait for the next drafted step). Any
width keeps the output exact: greedy output is the target's own, and rejection sampling is exact at every
width. Only speed depends on the choice.

`AdaptiveWidth` picks w to maximise expected committed tokens per second:

    E(w) = 1 + sum_{j=1}^{w-1} prod_{i=1}^{j} alpha_i        (alpha_i: acceptance of slot i, given slot i-1)
    w*   = argmax_w E(w) / t(w)                              (t(w): seconds of a step of width w)

with drafting (w > 1) required to win by a small margin (2 %).

alpha_i are decayed counts of this decode's own steps, pooled over rows (a Beta prior centred on the previous
slot's estimate keeps rarely reached slots from looking good by default). t(w) comes from a `CostModel`
(costs.py), measured once and cached, at the batch size of the step (`at_batch`): never from the live clock,
so the same request chooses the same widths, and gives the same tokens, every time (docs/design.md §14).

The first `opening` (2) steps verify the widest width, which tells every narrower width's acceptance too; from
the priors alone the cheapest drafted width would win and learn only of itself. They run only where some drafted
width pays at the priors' acceptance (`_may_pay`): not where a plain step is so cheap that no width can (an int4
target on a CPU), where they cost about 3 % of a 128-token answer. With a weak draft (or text it
cannot predict) this settles on w = 1, the target's own speed, and it re-tries
the runner-up width every `explore_every` steps so it notices when drafting pays again; every `explore_close`
steps while the runner-up is expected within `close` (10 %) of the best (a draft near break-even must not stay
switched off for a whole answer because its last estimate fell just short). Either interval is stretched where
a re-try would cost more than `explore_budget` (2 %) of the decode time, shared by the rows of a batch (2 % / r at
r rows: a re-try observes every row). And a re-try runs only where the width
could win at an optimistic acceptance (`could_win`): each estimate's upper confidence bound, from counts that fade
while nothing is observed. Where the draft is far from paying, as at 8 or 16 rows of a cheap CPU step, re-tries
then wait until the fading evidence leaves room for doubt instead of spending the budget.

Every policy has the same protocol (`WidthPolicy`): `at_batch(rows)`, `choose() -> width`, and
`observe(width, num_accepted, within=None)`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .costs import CostModel


class WidthPolicy(Protocol):
    """What a decode step asks of a width policy."""

    def at_batch(self, rows: int) -> None:
        """The next steps decode `rows` rows."""

    def choose(self) -> int:
        """The verify width of the next step (1: a plain step)."""

    def observe(self, width: int, num_accepted: list[int], within: dict[int, list[int]] | None = None) -> None:
        """A step of `width` ran; row r accepted num_accepted[r] proposals (within[w][r]: what a width-w tree's
        first nodes accepted, for trees)."""


class FixedWidth:
    """Always the full block."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def at_batch(self, rows: int) -> None:
        pass

    def choose(self) -> int:
        return self.block_size

    def observe(self, width: int, num_accepted: list[int], within: dict[int, list[int]] | None = None) -> None:
        pass


def expected_tokens(alpha: torch.Tensor) -> torch.Tensor:
    """E(w) for w = 1..K from slot acceptances alpha [K-1]: [K] float64, E(1) = 1."""
    reach = torch.cumprod(alpha.double(), 0)  # P(slots 1..j all accepted)
    return torch.cat([torch.ones(1, dtype=torch.float64), 1 + torch.cumsum(reach, 0)])


def candidate_widths(block_size: int) -> list[int]:
    """1, the powers of two below K, and K: few enough to measure each one quickly."""
    widths, w = {1, block_size}, 2
    while w < block_size:
        widths.add(w)
        w *= 2
    return sorted(widths)


def budgeted_interval(interval: float, lost: float, best_seconds: float, budget: float, rows: int = 1) -> float:
    """Steps between re-tries: at least `interval`, and enough that one costing `lost` seconds (against the best
    choice's expected tokens) takes at most `budget / rows` of the decode time, best steps taking `best_seconds`.

    A re-try in a batch of `rows` rows observes every row at once: sharing the budget among the rows buys the same
    evidence per step at every batch size (a re-try r times as rare tells as much), where one budget for the batch
    would spend it r times over on evidence the width policy pools."""
    return max(interval, lost * rows / (budget * best_seconds))


UCB_LOG = 3.0  # ln(1/delta), delta = 0.05: the Hoeffding bound's one-sided miss rate
FADE = 0.97  # per step without an observation: the weight left of the counts when judging a re-try


def upper_bound(mean: float, count: float, span: float = 1.0) -> float:
    """Hoeffding's upper confidence bound on a mean of `count` observations within [0, span]."""
    return mean + span * (UCB_LOG / (2.0 * count)) ** 0.5


class AdaptiveWidth:
    """The width with the most expected tokens per second, from this decode's acceptance and the cost model.

    `drafts=False` prices every width as a step without the draft (a prompt lookup's own blocks, lookup.py).
    `plain_only=True` never chooses a drafted width: the draft never runs, and a lookup weighs its runs against
    plain steps alone (DecodeOptions.drafting)."""

    def __init__(self, block_size: int, costs: CostModel, *, drafts: bool = True, decay: float = 0.97,
                 explore_every: int = 32, explore_close: int = 8, close: float = 0.9, prior_strength: float = 2.0,
                 margin: float = 1.02, explore_budget: float = 0.02, opening: int = 2,
                 prior: tuple[float, float | None] = (0.5, None), plain_only: bool = False) -> None:
        if not isinstance(costs, CostModel):
            raise TypeError(f"an adaptive width needs a CostModel (decode/costs.py), got {type(costs).__name__}")
        self.block_size, self.costs, self.drafts, self.plain_only = block_size, costs, drafts, plain_only
        self.widths = candidate_widths(block_size)
        self.decay, self.prior_strength, self.margin = decay, prior_strength, margin
        # The prior mean acceptance of slot 1, and of slot 2 (None: slot 1's posterior); every later slot's is the
        # previous slot's posterior. A source whose acceptance is known beforehand starts from it (lookup.py).
        if not all(p is None or 0.0 < p < 1.0 for p in prior):
            raise ValueError(f"prior acceptances must lie strictly between 0 and 1, got {prior}")
        self.prior = prior
        self.explore_every, self.explore_close, self.close = explore_every, explore_close, close
        self.explore_budget = explore_budget  # the most of the decode time that re-tries may cost
        # The first steps are the widest: from the priors alone every width looks alike and the cheapest drafted
        # width would win, which tells nothing of the wider ones (a tree of 2 nodes only of itself).
        self.opening = opening if drafts else 0
        self.reached = torch.zeros(block_size - 1, dtype=torch.float64)  # decayed counts per slot 1..K-1
        self.accepted = torch.zeros(block_size - 1, dtype=torch.float64)
        self.rows = 1  # rows of the steps being chosen now (`at_batch`)
        self.last_explored = 0  # step of the last re-try of a width that was not the best
        self.explorations = 0
        self.steps = 0
        self.last_observed = 0  # step of the last observation (a drafted step): the counts fade from there
        # What `gains` and `choose` derive from the counts, kept until the counts change (`_changed`): a plain step
        # changes nothing, and a decode that stopped drafting asks the same question at every step.
        self._memo: dict = {}
        self.version = 0  # counts changes of the counts: what others derive from this policy is keyed on it

    def _changed(self) -> None:
        self._memo.clear()
        self.version += 1

    def _memoized(self, key, compute):
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def at_batch(self, rows: int) -> None:
        """The next steps decode `rows` rows: price them at that batch size."""
        self.rows = rows

    def step_seconds(self, width: int) -> float:
        """Expected seconds of a step of `width` at the current batch size."""
        return self.costs.seconds(self.rows, width, drafted=self.drafts and width > 1)

    def seconds_per_position(self) -> float:
        """What one more verified position costs at the current batch size."""
        return self.costs.per_position(self.rows)

    def alpha(self) -> torch.Tensor:
        """Posterior mean acceptance of slots 1..K-1 [K-1]; each slot's prior mean is the previous slot's posterior
        (slot 1's, and slot 2's where given: `prior`)."""
        out, (prior, second) = [], self.prior  # Python floats: this runs every step, a loop over tensor scalars ~0.1 ms
        for slot, (accepted, reached) in enumerate(zip(self.accepted.tolist(), self.reached.tolist())):
            if slot == 1 and second is not None:
                prior = second
            prior = (accepted + self.prior_strength * prior) / (reached + self.prior_strength)
            out.append(prior)
        return torch.tensor(out, dtype=torch.float64)

    def gains(self) -> torch.Tensor:
        """E(w) for w = 1..K [K] float64: expected committed tokens of a step of each width (read-only: shared by
        every call until the counts change)."""
        return self._memoized("gains", self._gains)

    def _gains(self) -> torch.Tensor:
        return expected_tokens(self.alpha())

    def rate(self, width: int, gain: torch.Tensor | None = None) -> float:
        """Expected tokens per second of `width`."""
        gain = self.gains() if gain is None else gain
        return float(gain[width - 1]) / self.step_seconds(width)

    def best_rate(self) -> float:
        """The best expected tokens per second over the widths (a plain step's where only plain steps run)."""
        gain = self.gains()
        return max(self.rate(w, gain) for w in ([1] if self.plain_only else self.widths))

    def choose(self) -> int:
        if self.plain_only:
            return 1
        best, explore, runner_up, interval, may_pay = self._memoized(("plan", self.rows, self.explorations),
                                                                     self._plan)
        if self.steps < self.opening and may_pay:
            return self.widths[-1]  # the widest step tells what every narrower width would have accepted
        if self.steps - self.last_explored >= interval:
            # Re-try the runner-up, the width most likely to take over: while plain steps win, only a drafting
            # step can tell that the draft has started to hit. Not where it could not win even optimistically:
            # asked again after another interval, when the counts have faded further.
            self.last_explored = self.steps
            explore = next((w for w in (explore, runner_up) if self.could_win(w, best)), None)
            if explore is None:
                return best
            self.explorations += 1
            return explore
        return best

    def fading(self) -> float:
        """The weight left of the counts, for judging a re-try: FADE per step since the last observation."""
        return FADE ** (self.steps - self.last_observed)

    def optimistic_gain(self, width: int, fade: float | None = None) -> float:
        """E(width) at each slot's upper confidence bound, prior counts included, the counts weighted by `fade`
        (default: `fading()`)."""
        reach, total, fade = 1.0, 1.0, self.fading() if fade is None else fade
        for alpha, reached in zip(self.alpha().tolist()[: width - 1], self.reached.tolist()):
            reach *= min(1.0, upper_bound(alpha, fade * reached + self.prior_strength))
            total += reach
        return total

    def could_win(self, width: int, best: int) -> bool:
        """Whether `width` at an optimistic acceptance beats `best` at the expected one (by the drafting margin):
        whether a re-try of it can tell anything that would change the choice."""
        if width == best:
            return False
        optimistic = self.optimistic_gain(width) / self.step_seconds(width)
        return optimistic > self.rate(best) * (self.margin if width > 1 else 1.0)

    def _plan(self) -> tuple[int, int, int, float, bool]:
        """(best width, the width a re-try would take, the runner-up (a re-try's second choice), steps between
        re-tries, whether some drafted width may pay) at the counts, batch size and re-tries so far."""
        gain = self.gains()

        def score(w: int) -> float:  # drafting must win by `margin`: a near-tie is not worth a wider verify
            return self.rate(w, gain) / (self.margin if w > 1 else 1.0)

        ranked = sorted(self.widths, key=score, reverse=True)
        best, explore = ranked[0], self._explore(ranked, self.explorations + 1)
        interval = self.explore_close if score(ranked[1]) >= self.close * score(best) else self.explore_every
        # Seconds one re-try loses against the best width producing the same expected tokens.
        lost = self.step_seconds(explore) - float(gain[explore - 1] / gain[best - 1]) * self.step_seconds(best)
        interval = budgeted_interval(interval, lost, self.step_seconds(best), self.explore_budget, self.rows)
        return best, explore, ranked[1], interval, self._may_pay(gain)

    def _may_pay(self, gain: torch.Tensor) -> bool:
        """Whether some drafted width beats a plain step at the acceptance known so far (asked during the opening:
        at the first step that is the priors'). Where even the priors cannot pay, as for a step as cheap as an int4
        target's on a CPU, the opening's wide steps would lose on most requests, and the budgeted re-tries alone
        look for a draft that pays."""
        plain = self.rate(1, gain)
        return any(self.rate(w, gain) > plain * self.margin for w in self.widths if w > 1)

    def _explore(self, ranked: list[int], count: int) -> int:
        """The width of the count-th re-try, from the widths ranked best first: the runner-up."""
        return ranked[1]

    def observe(self, width: int, num_accepted: list[int], within: dict[int, list[int]] | None = None) -> None:
        """One step of `width` ran; row r accepted num_accepted[r] of its width-1 proposals."""
        self.steps += 1
        self.record(width, num_accepted)
        if width > 1:
            self.last_observed = self.steps

    def record(self, width: int, num_accepted: list[int], reach: list[int] | None = None) -> None:
        """Row r accepted num_accepted[r] of the width-1 proposals it was given (of reach[r] <= width-1 where a
        row was given fewer: a ragged step)."""
        if width == 1:
            return  # nothing was proposed: acceptance counts stay as they were
        self._changed()
        self.reached *= self.decay
        self.accepted *= self.decay
        slots = torch.arange(1, width, dtype=torch.long)  # slots 1..w-1
        for r, a in enumerate(num_accepted):
            given = (slots <= reach[r]).double() if reach is not None else 1.0  # slots row r had a proposal for
            self.reached[: width - 1] += (slots <= a + 1).double() * given  # slot k is reached when k-1 were accepted
            self.accepted[: width - 1] += (slots <= a).double() * given


class TreeWidth(AdaptiveWidth):
    """The node count of a token tree (tree.py) with the most expected tokens per second.

    A tree's first w nodes are the tree of w nodes, so a step of width W reports, per row, what each width
    w <= W would have accepted (`within`); E(w) is then a decayed mean of measured tokens per step, not a
    product of slot acceptances. A width not yet observed borrows the previous width's mean (more nodes never
    accept less), through the same prior as the chain's slots.
    """

    def __init__(self, max_width: int, costs: CostModel, slots: int | None = None, **kwargs) -> None:
        super().__init__(max_width, costs, **kwargs)
        self.slots = max_width - 1 if slots is None else slots  # the deepest a node can be: the draft's K - 1
        self.accepted_sum = torch.zeros(max_width, dtype=torch.float64)  # decayed sum of accepted guesses
        self.observed = torch.zeros(max_width, dtype=torch.float64)  # decayed count of rows observed

    def _gains(self) -> torch.Tensor:
        # Each width's mean is shrunk towards the previous width's (towards 0.5 accepted guesses for w = 2, the
        # chain's even first-slot prior: a pessimistic start would keep a good draft switched off), and never
        # falls below it: more nodes never accept less.
        out, previous = [1.0], None  # Python floats, as in `alpha`
        for total, rows in zip(self.accepted_sum.tolist()[1:], self.observed.tolist()[1:]):  # w = 2..max
            centre = 0.5 if previous is None else previous
            mean = (total + self.prior_strength * centre) / (rows + self.prior_strength)
            previous = mean if previous is None else max(mean, previous)
            out.append(1 + previous)
        return torch.tensor(out, dtype=torch.float64)

    def _explore(self, ranked: list[int], count: int) -> int:
        """Every other re-try is of the widest tree, which also tells what every narrower tree would have
        accepted: a width that lost on a few early steps is re-assessed, not left on its first estimate."""
        widest = self.widths[-1]
        return widest if count % 2 and ranked[0] != widest else ranked[1]

    def optimistic_gain(self, width: int, fade: float | None = None) -> float:
        """E(width) at the upper confidence bound of its mean accepted guesses (0 to the tree's depth a row),
        the counts weighted by `fade` (default: `fading()`)."""
        mean, deepest = float(self.gains()[width - 1]) - 1, float(min(width - 1, self.slots))
        rows = (self.fading() if fade is None else fade) * float(self.observed[width - 1]) + self.prior_strength
        return 1 + min(deepest, upper_bound(mean, rows, span=deepest))

    def observe(self, width: int, num_accepted: list[int], within: dict[int, list[int]] | None = None) -> None:
        """One step of `width` ran; within[w][r]: guesses row r's first w nodes accepted."""
        self.steps += 1
        if width == 1:
            return
        self.last_observed = self.steps
        within = within or {width: num_accepted}
        self._changed()
        self.accepted_sum *= self.decay
        self.observed *= self.decay
        for w, accepted in within.items():
            self.accepted_sum[w - 1] += sum(accepted)
            self.observed[w - 1] += len(accepted)


def make_policy(block_size: int, adaptive: bool, costs: CostModel | None = None, tree: bool = False,
                drafting: bool = True):
    """A fresh policy: adaptive (AdaptiveWidth; TreeWidth over 1..2K nodes for a tree), or the full block (K
    slots or K nodes); without `drafting`, an adaptive one held to plain steps (a lookup's runs are priced
    against them)."""
    if (adaptive or not drafting) and block_size > 1:
        if tree:
            return TreeWidth(2 * block_size, costs, slots=block_size - 1, plain_only=not drafting)
        return AdaptiveWidth(block_size, costs, plain_only=not drafting)
    return FixedWidth(block_size)
