"""How many draft proposals each step verifies: a fixed block, or the width that pays best right now.

A step of width w verifies the anchor plus w-1 proposals in one target forward (w = 1: no proposal, a
plain target step; the target still taps its features, which wait for the next drafted step). Any
width keeps the output exact: greedy output is the target's own, and rejection sampling is exact at every
width. Only speed depends on the choice.

`AdaptiveWidth` picks w to maximise expected committed tokens per second:

    E(w) = 1 + sum_{j=1}^{w-1} prod_{i=1}^{j} alpha_i        (alpha_i: acceptance of slot i, given slot i-1)
    w*   = argmax_w E(w) / t(w)                              (t(w): measured seconds of a step of width w)

with drafting (w > 1) required to win by a small margin (2 %), so that timing noise does not buy slow steps.

alpha_i are decayed counts pooled over rows (a Beta prior centred on the previous slot's estimate keeps
rarely reached slots from looking good by default). t(w) is an exponential average of measured step times,
robust to brief spikes (`smoothed_time`); every width is timed twice before the first choice (the lower of the
two counts), and once the drafted steps (token trees report theirs) spread over enough widths, a drafted
width's t(w) is read off a line fitted through all of them against their verified positions, which also prices
a lookup run grafted onto a tree (lookup.py).
Step times depend on how many rows a step decodes (a server's batches vary, and a batch shrinks as its rows
finish): every timing above is kept per batch-size bucket (1, 2, 3-4, 5-8, ...; `at_batch`, told by each
step), so a width is judged by steps of the size at hand; a new bucket starts from the nearest timed bucket's
times, each replaced by its first own measurement. Acceptance is shared by all buckets: it depends on the draft
and the text, not on the batch.
With a weak draft (or text it cannot predict) this settles on w = 1, the target's own speed, and it
re-measures the runner-up width every `explore_every` steps so it notices when drafting pays again; every
`explore_close` steps while the runner-up is expected within `close` (10 %) of the best. Near a tie a
re-measurement costs little (at most that 10 % of one step) and decides the most: a draft near break-even
must not stay switched off for a whole answer because its last estimate fell just short. While drafting wins,
every third re-measurement is a plain step: t(1) is the yardstick of every choice, and no drafted step re-times
it. Either interval is stretched where a re-measurement would cost more than `explore_budget` (2 %) of the
decode time: a wide tree over a batch of rows can cost several plain steps.

With sampling, widths chosen from wall-clock times make a seeded sample depend on timing (the output is still
distributed exactly as the target's); use a fixed width where a seed must reproduce the same text.
"""

from __future__ import annotations

import torch


class FixedWidth:
    """Always the full block."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def choose(self) -> int:
        return self.block_size

    def observe(self, width: int, num_accepted: list[int], seconds: float) -> None:
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


def budgeted_interval(interval: float, lost: float, best_seconds: float, budget: float) -> float:
    """Steps between re-measurements: at least `interval`, and enough that one costing `lost` seconds (against
    the best choice's expected tokens) takes at most `budget` of the decode time, best steps taking
    `best_seconds`."""
    return max(interval, lost / (budget * best_seconds))


SPIKE = 1.5  # a step timed above this multiple of its width's estimate counts as this multiple (see smoothed_time)


def smoothed_time(estimate: float | None, count: int, seconds: float, smoothing: float) -> float:
    """A width's step-time estimate after its (count+1)-th measurement `seconds`.

    The first two measurements keep the lower: a first step of a shape may pay one-off costs, and a second may
    be hit by a spike (an interrupt, another process) as well. After that an exponential average: timing noise
    is mostly upward and brief, so a measurement enters it at most SPIKE times the estimate (one slow step must
    not turn a width's estimate for many steps; a lasting slowdown still moves it by up to (SPIKE - 1) *
    smoothing a step), and a faster one than the estimate, which noise rarely makes, with twice the weight (an
    estimate taken in a slow spell, re-measured only now and then, must not need many re-measurements to heal)."""
    if count == 0 or estimate is None:
        return seconds
    if count == 1:
        return min(estimate, seconds)
    if seconds < estimate:
        weight = min(1.0, 2 * smoothing)
        return (1 - weight) * estimate + weight * seconds
    return (1 - smoothing) * estimate + smoothing * min(seconds, SPIKE * estimate)


def batch_bucket(rows: int) -> int:
    """The timing bucket of a step over `rows` rows: the next power of two (1, 2, 4, 8, ...)."""
    return 1 << max(rows - 1, 0).bit_length()


class StepTimes:
    """One batch-size bucket's step times: per width, and the line of drafted steps against verified positions."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}  # width -> smoothed step time
        self.measurements: dict[int, int] = {}  # width -> how many steps of it were timed
        self.cost_fit = [0.0] * 5  # decayed sums over drafted steps: count, positions, seconds, positions^2, p*s
        self.borrowed: set[int] = set()  # widths whose time is another bucket's, until first timed here

    def timed(self, width: int) -> bool:
        """Whether `width` has a time to be judged by: timed twice here, or borrowed."""
        return self.measurements.get(width, 0) >= 2 or width in self.borrowed


class AdaptiveWidth:
    """The width with the most expected tokens per second, from measured acceptance and step times."""

    def __init__(self, block_size: int, *, decay: float = 0.97, time_smoothing: float = 0.3,
                 explore_every: int = 32, explore_close: int = 8, close: float = 0.9, prior_strength: float = 2.0,
                 margin: float = 1.02, explore_budget: float = 0.02) -> None:
        self.block_size = block_size
        self.widths = candidate_widths(block_size)
        self.decay, self.time_smoothing = decay, time_smoothing
        self.explore_every, self.prior_strength, self.margin = explore_every, prior_strength, margin
        self.explore_close, self.close = explore_close, close
        self.explore_budget = explore_budget  # the most of the decode time that re-measurements may cost
        self.reached = torch.zeros(block_size - 1, dtype=torch.float64)  # decayed counts per slot 1..K-1
        self.accepted = torch.zeros(block_size - 1, dtype=torch.float64)
        self.times: dict[int, StepTimes] = {1: StepTimes()}  # batch-size bucket -> its step times
        self.bucket = 1  # the bucket of the steps being chosen and observed now (`at_batch`)
        self.last_explored = 0  # step of the last re-measurement of a width that was not the best
        self.explorations = 0
        self.steps = 0

    def at_batch(self, rows: int) -> None:
        """The next steps decode `rows` rows: choose and time them with that batch-size bucket's step times."""
        self.bucket = batch_bucket(rows)
        if self.bucket not in self.times or not self.times[self.bucket].seconds:  # new, or never timed yet
            self.times[self.bucket] = self._borrowed_times()

    def _borrowed_times(self) -> StepTimes:
        """A new bucket's start: the per-width times of the nearest bucket whose widths are all timed, each
        replaced outright by its first own measurement, instead of timing every width twice again (a batch whose
        rows finish one by one would spend its last steps re-timing widths). Times from a larger batch make
        drafting look dearer, so the new bucket starts on plain steps and re-measures the runner-up; from a
        smaller one cheaper, so it drafts and corrects on the first step."""
        times = StepTimes()
        done = [b for b, t in self.times.items() if all(t.timed(w) for w in self.widths)]
        if done:
            near = min(done, key=lambda b: (abs(b.bit_length() - self.bucket.bit_length()), b))
            times.seconds = dict(self.times[near].seconds)
            times.borrowed = set(times.seconds)
        return times

    @property
    def seconds(self) -> dict[int, float]:
        """width -> smoothed step time, in the current bucket."""
        return self.times[self.bucket].seconds

    @property
    def measurements(self) -> dict[int, int]:
        return self.times[self.bucket].measurements

    @property
    def cost_fit(self) -> list[float]:
        return self.times[self.bucket].cost_fit

    @cost_fit.setter
    def cost_fit(self, value: list[float]) -> None:
        self.times[self.bucket].cost_fit = value

    def alpha(self) -> torch.Tensor:
        """Posterior mean acceptance of slots 1..K-1 [K-1]; each slot's prior mean is the previous slot's."""
        out, prior = [], 0.5  # Python floats: this runs every step, and a loop over tensor scalars costs ~0.1 ms
        for accepted, reached in zip(self.accepted.tolist(), self.reached.tolist()):
            prior = (accepted + self.prior_strength * prior) / (reached + self.prior_strength)
            out.append(prior)
        return torch.tensor(out, dtype=torch.float64)

    def gains(self) -> torch.Tensor:
        """E(w) for w = 1..K [K] float64: expected committed tokens of a step of each width."""
        return expected_tokens(self.alpha())

    def choose(self) -> int:
        unmeasured = [w for w in self.widths if not self.times[self.bucket].timed(w)]
        if unmeasured:  # time every width twice first (a first step of a shape may pay one-off costs)
            return unmeasured[0]
        gain = self.gains()

        def rate(w: int) -> float:  # expected tokens per second; drafting must win by `margin` (timing noise)
            return float(gain[w - 1]) / self.step_seconds(w) / (self.margin if w > 1 else 1.0)

        ranked = sorted(self.widths, key=rate, reverse=True)
        interval = self.explore_close if rate(ranked[1]) >= self.close * rate(ranked[0]) else self.explore_every
        explore = self._explore(ranked, self.explorations + 1)
        # Seconds one re-measurement loses against the best width producing the same expected tokens: capped at
        # `explore_budget` of the decode time (a wide tree over a batch can cost several plain steps).
        best = ranked[0]
        lost = self.step_seconds(explore) - float(gain[explore - 1] / gain[best - 1]) * self.step_seconds(best)
        interval = budgeted_interval(interval, lost, self.step_seconds(best), self.explore_budget)
        if self.steps - self.last_explored >= interval:
            # Re-measure the runner-up, the width most likely to take over: machines drift, batches shrink,
            # and while plain steps win only a drafting step can tell that the draft has started to hit.
            self.last_explored = self.steps
            self.explorations += 1
            return explore
        return best

    def _explore(self, ranked: list[int], count: int) -> int:
        """The width of the count-th re-measurement, from the widths ranked best first: the runner-up, the width
        most likely to take over; and every third time, while drafting wins, a plain step, whose time is the
        yardstick of every choice and which no drafted step re-times (machines drift; a slow early plain step
        would otherwise make drafting look good for the whole run)."""
        if count % 3 == 0 and 1 not in ranked[:2]:
            return 1
        return ranked[1]

    def best_rate(self) -> float | None:
        """The best expected tokens per second over the widths (None until every width has been timed)."""
        if any(w not in self.seconds for w in self.widths):
            return None
        gain = self.gains()
        return max(float(gain[w - 1]) / self.step_seconds(w) for w in self.widths)

    def step_seconds(self, width: int) -> float:
        """Expected seconds of a step of `width`: for a drafted width, the line fitted through every drafted
        step's time (`observe_cost`) once there is one, so that a width timed long ago, or only on a slow
        first step, is judged by today's steps of all widths; else the width's own smoothed measurement."""
        fit = self._cost_line() if width > 1 else None
        return fit[0] + fit[1] * width if fit is not None else self.seconds[width]

    def observe(self, width: int, num_accepted: list[int], seconds: float) -> None:
        """One step of `width` took `seconds`; row r accepted num_accepted[r] of its width-1 proposals."""
        self._time(width, seconds)
        self.record(width, num_accepted)

    def record(self, width: int, num_accepted: list[int]) -> None:
        """Acceptance only (no timing): row r accepted num_accepted[r] of the width-1 proposals it was given."""
        if width == 1:
            return  # nothing was proposed: acceptance counts stay as they were
        self.reached *= self.decay
        self.accepted *= self.decay
        slots = torch.arange(1, width, dtype=torch.long)  # slots 1..w-1
        for a in num_accepted:
            self.reached[: width - 1] += (slots <= a + 1).double()  # slot k is reached when k-1 were accepted
            self.accepted[: width - 1] += (slots <= a).double()


    def observe_cost(self, positions: int, seconds: float) -> None:
        """A drafted step verified `positions` tokens in `seconds` (a token tree with a lookup run grafted on may
        verify more than its width): one point of the step-time line that `seconds_per_position` fits. Steps
        before every width has been timed twice are left out (a first step of a shape may pay one-off costs)."""
        if not all(self.times[self.bucket].timed(w) for w in self.widths):
            return
        line = self._cost_line()
        predicted = line[0] + line[1] * positions if line is not None else 0.0
        if predicted > 0:  # a spike enters the fit at most SPIKE times the line's own time (see smoothed_time)
            seconds = min(seconds, SPIKE * predicted)
        d = self.decay
        self.cost_fit = [d * x + y for x, y in zip(self.cost_fit, (1.0, positions, seconds, positions**2,
                                                                      positions * seconds))]

    def seconds_per_position(self) -> float | None:
        """What one more verified position costs: the slope of a least-squares line through the drafted steps'
        (positions, seconds), decayed like the acceptance counts; until their positions vary enough, the slope
        from width 2 to the widest (both drafted, so the draft's own cost cancels); None until both are timed."""
        fit = self._cost_line()
        if fit is not None:
            return fit[1]
        top = self.widths[-1]
        if top <= 2 or 2 not in self.seconds or top not in self.seconds:
            return None
        return max(0.0, (self.seconds[top] - self.seconds[2]) / (top - 2))

    def _cost_line(self) -> tuple[float, float] | None:
        """(intercept, slope) of drafted step seconds against verified positions; None until at least 4 steps
        whose positions spread enough (a variance of 1) to tell a slope."""
        count, n, t, nn, nt = self.cost_fit
        if count < 4 or nn / count - (n / count) ** 2 < 1.0:
            return None
        slope = max(0.0, (nt / count - n * t / count**2) / (nn / count - (n / count) ** 2))
        return t / count - slope * n / count, slope

    def _time(self, width: int, seconds: float) -> None:
        self.steps += 1
        times = self.times[self.bucket]
        if width in times.borrowed:  # the first own measurement replaces another bucket's time, and counts as timed
            times.borrowed.discard(width)
            times.measurements[width] = 2
            times.seconds[width] = seconds
            return
        count = self.measurements.get(width, 0)
        self.seconds[width] = smoothed_time(self.seconds.get(width), count, seconds, self.time_smoothing)
        self.measurements[width] = count + 1


class TreeWidth(AdaptiveWidth):
    """The node count of a token tree (tree.py) with the most expected tokens per second.

    A tree's first w nodes are the tree of w nodes, so a step of width W reports, per row, what each width
    w <= W would have accepted (`within`); E(w) is then a decayed mean of measured tokens per step, not a
    product of slot acceptances. A width not yet observed borrows the previous width's mean (more nodes never
    accept less), through the same prior as the chain's slots.
    """

    def __init__(self, max_width: int, **kwargs) -> None:
        super().__init__(max_width, **kwargs)
        self.accepted_sum = torch.zeros(max_width, dtype=torch.float64)  # decayed sum of accepted guesses
        self.observed = torch.zeros(max_width, dtype=torch.float64)  # decayed count of rows observed

    def gains(self) -> torch.Tensor:
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
        """Every other re-measurement is of the widest tree, which also tells what every narrower tree would
        have accepted: a width that lost on a few early steps is re-assessed, not left on its first estimate."""
        widest = self.widths[-1]
        return widest if count % 2 and ranked[0] != widest else super()._explore(ranked, count)

    def observe(self, width: int, num_accepted: list[int], seconds: float,
                within: dict[int, list[int]] | None = None) -> None:
        """One step of `width` took `seconds`; within[w][r]: guesses row r's first w nodes accepted."""
        self._time(width, seconds)
        if width == 1:
            return
        within = within or {width: num_accepted}
        self.accepted_sum *= self.decay
        self.observed *= self.decay
        for w, accepted in within.items():
            self.accepted_sum[w - 1] += sum(accepted)
            self.observed[w - 1] += len(accepted)


def make_policy(block_size: int, adaptive, tree: bool = False):
    """adaptive: True (AdaptiveWidth; TreeWidth over 1..2K nodes for a tree), False (the full block: K slots or
    K nodes), or a policy object (choose/observe), used as is."""
    if not isinstance(adaptive, bool):
        return adaptive
    if adaptive and block_size > 1:
        return TreeWidth(2 * block_size) if tree else AdaptiveWidth(block_size)
    return FixedWidth(block_size)
