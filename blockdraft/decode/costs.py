"""What a decode step costs: seconds by batch rows and verified positions, measured once, never per step.

The width policy (policy.py) weighs each width's expected tokens against what a step of that width costs. It
never reads a live clock: in 16-bit floats a K-row verify rounds near-ties differently from a narrower one, so
widths chosen from wall-clock times would make the same request give different text from run to run
(docs/design.md §14). Instead a `CostModel` is measured once, before the first decode that needs it, per
batch-size bucket (`measure_costs`), and kept for the process and on disk (`cache_root()/costs`, one JSON file per
key), keyed by the target, the draft, dtype, device, threads, torch version and a digest of the code a step runs
(cost_key.py: a table timed before an upgrade or an edit is timed again): the same request then chooses the
same widths in every run on that machine.

Every kind of step (plain, each drafted width, each count of a ragged step's extra positions) is timed in turn,
step after step, in one decode, so that every kind meets the machine's slow and fast spells alike. A kind's cost
in plain steps is the median, over the cycles, of its step's seconds over the plain step's of the same cycle: a
spell of another job or of a faster clock slows or speeds both alike, and a step that ran alone in a spell counts
once among many. The plain step is priced by its fastest, which other jobs cannot make look slower, and every
other kind at that times its cost in plain steps. No statistic of the times saves a table timed while another
job held the cores at every step (it bends every kind's price toward the plain step's), so the share of each
bucket's timing that our threads waited for a CPU is kept with it (cpu_wait.py): a bucket timed busy is measured
again at the first start on a quiet machine (measure.py). A cache read from disk is checked against a few plain
steps timed at load at every batch size it holds and, where it no longer fits, a warning says so
(`stale_cache_note`). `--measure-costs` (or deleting the file) measures again. Tests and callers may pass a model
of their own (`linear_costs`).

Step times depend on how many rows a step decodes, so every table is kept per batch-size bucket (1, 2, 4, 8,
...; `batch_bucket`); a bucket not measured borrows the nearest measured one.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .cpu_wait import WaitWatch, busy

ROUNDS = 3  # decodes that each take every kind in turn (see measure_costs), one after another
STEPS_PER_ROUND = 5  # timed cycles of every kind per round (after WARM_STEPS untimed ones)
WARM_STEPS = 2  # a first step of a shape pays one-off costs (allocation, kernel selection)
EXTRA_ROUNDS = 3  # at most this many more rounds where a drafted width timed faster than a plain step (see below)
# Positions of the synthetic prompt the steps are timed on: a served answer's context is a few hundred positions,
# and the extra positions of a step attend over it (over 320 positions 4 more positions of 8 q4 rows cost 8.6 ms,
# over 64 5.6 ms)
PROMPT_LENGTH = 256


def batch_bucket(rows: int) -> int:
    """The timing bucket of a step over `rows` rows: the next power of two (1, 2, 4, 8, ...)."""
    return 1 << max(rows - 1, 0).bit_length()


@dataclass
class CostModel:
    """Seconds of one decode step, per batch-size bucket: a plain step (one position, no draft) and drafted steps
    at measured verify widths (positions, anchor included). Between and past measured widths a drafted step is
    read off the straight line through its neighbours; a plain step of p positions (a lookup block) costs the
    plain step plus `per_position` for each position past the first."""

    plain: dict[int, float] = field(default_factory=dict)  # bucket -> seconds
    drafted: dict[int, dict[int, float]] = field(default_factory=dict)  # bucket -> {positions: seconds}
    # bucket -> {extra positions: seconds} of a ragged step (a plain step whose rows verify that many more
    # positions between them, no draft: decode/step.py); empty where not measured (`ragged_seconds` then prices
    # each extra position at `per_position` / rows)
    ragged: dict[int, dict[int, float]] = field(default_factory=dict)
    # bucket -> the share of its measurement that our threads spent waiting for a CPU (cpu_wait.py); absent where
    # the kernel does not say. A bucket at cpu_wait.BUSY_SHARE or more was timed on a busy machine (`busy_buckets`)
    waited: dict[int, float] = field(default_factory=dict)
    # seconds() and per_position() by their arguments: a policy asks about ten of them at every step, and the
    # answers change only with `update`
    _known: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def buckets(self) -> set[int]:
        return set(self.plain) & set(self.drafted)

    def busy_buckets(self) -> set[int]:
        """The buckets timed while other work kept our threads waiting for a CPU (cpu_wait.busy)."""
        return {b for b in self.buckets() if busy(self.waited.get(b))}

    def without(self, buckets: set[int]) -> CostModel:
        """This model less `buckets` (to be measured again)."""
        def keep(table: dict) -> dict:
            return {b: v for b, v in table.items() if b not in buckets}
        return CostModel(keep(self.plain), keep(self.drafted), keep(self.ragged), keep(self.waited))

    def _bucket(self, rows: int) -> int:
        """The measured bucket nearest to `rows`' bucket (the smaller on a tie)."""
        want, known = batch_bucket(rows), sorted(self.buckets())
        if not known:
            raise ValueError("this CostModel holds no measurements; measure it with measure_costs first")
        return min(known, key=lambda b: (abs(b.bit_length() - want.bit_length()), b))

    def seconds(self, rows: int, positions: int, drafted: bool) -> float:
        """Expected seconds of a step over `rows` rows verifying `positions` positions, with or without the draft."""
        key = (rows, positions, drafted)
        if key not in self._known:
            self._known[key] = self._seconds(rows, positions, drafted)
        return self._known[key]

    def _seconds(self, rows: int, positions: int, drafted: bool) -> float:
        bucket = self._bucket(rows)
        if not drafted:
            return self.plain[bucket] + self.per_position(rows) * max(positions - 1, 0)
        table = self.drafted[bucket]
        widths = sorted(table)
        if positions in table or len(widths) == 1:
            return table.get(positions, table[widths[0]])
        # The segment that holds `positions`, or the first or last one to extrapolate from.
        upper = next((w for w in widths[1:] if w >= positions), widths[-1])
        lower = widths[widths.index(upper) - 1]
        slope = (table[upper] - table[lower]) / (upper - lower)
        return max(table[lower] + slope * (positions - lower), 0.0)

    def ragged_seconds(self, rows: int, extra: int) -> float:
        """Expected seconds of a plain step over `rows` rows that verifies `extra` more positions between them (a
        ragged chain of lookup runs). Measured at a few counts (`RAGGED_EXTRA`; 0: the plain step), read off the
        straight line between them (beyond the last: its slope); the products of an int4 target run rows in blocks
        (1-4, 5-8, 9-12, ... cost alike at SmolLM2's widths on an EPYC), so a step's cost is not linear in its rows."""
        key = ("ragged", rows, extra)
        if key not in self._known:
            self._known[key] = self._ragged_seconds(rows, extra)
        return self._known[key]

    def _ragged_seconds(self, rows: int, extra: int) -> float:
        bucket = self._bucket(rows)
        table = {0: self.plain[bucket], **self.ragged.get(bucket, {})}  # its own plain step where timed
        plain = table[0]
        if extra <= 0:
            return plain
        if len(table) == 1:
            return plain + extra * self.per_position(rows) / bucket
        counts = sorted(table)
        if extra in table:
            return table[extra]
        upper = next((e for e in counts[1:] if e >= extra), counts[-1])
        lower = counts[counts.index(upper) - 1]
        slope = (table[upper] - table[lower]) / (upper - lower)
        return max(table[lower] + slope * (extra - lower), plain)

    def per_position(self, rows: int) -> float:
        """What one more verified position costs: the slope from the narrowest to the widest drafted step (both
        run the draft, so its own cost cancels), never negative."""
        key = ("per position", rows)
        if key not in self._known:
            table = self.drafted[self._bucket(rows)]
            low, high = min(table), max(table)
            self._known[key] = max((table[high] - table[low]) / (high - low), 0.0) if high > low else 0.0
        return self._known[key]

    def break_even(self, rows: int, positions: int) -> float:
        """The tokens a drafted step of `positions` verified positions must return (tau, bonus included) to pay for
        itself against plain steps of one token each: its cost in plain steps."""
        return self.seconds(rows, positions, drafted=True) / self.seconds(rows, 1, drafted=False)

    def to_json(self) -> dict:
        return {"plain": {str(b): s for b, s in self.plain.items()},
                "drafted": {str(b): {str(w): s for w, s in t.items()} for b, t in self.drafted.items()},
                "ragged": {str(b): {str(e): s for e, s in t.items()} for b, t in self.ragged.items()},
                "waited": {str(b): share for b, share in self.waited.items()}}

    @classmethod
    def from_json(cls, data: dict) -> CostModel:
        return cls({int(b): float(s) for b, s in data["plain"].items()},
                   {int(b): {int(w): float(s) for w, s in t.items()} for b, t in data["drafted"].items()},
                   {int(b): {int(e): float(s) for e, s in t.items()} for b, t in data.get("ragged", {}).items()},
                   {int(b): float(share) for b, share in data.get("waited", {}).items()})

    def update(self, other: CostModel) -> None:
        self.plain.update(other.plain)
        self.drafted.update(other.drafted)
        self.ragged.update(other.ragged)
        for bucket in other.buckets():  # a bucket measured again drops what was known of its last measurement
            self.waited.pop(bucket, None)
        self.waited.update(other.waited)
        self._known.clear()


def linear_costs(plain: float, draft: float, per_position: float, widths=(2, 4, 8, 16, 32),
                 buckets=(1, 2, 4, 8, 16, 32, 64)) -> CostModel:
    """A model where a plain step costs `plain`, the draft adds `draft`, and each verified position past the first
    adds `per_position` seconds, the same in every bucket (tests; a first guess where nothing can be measured)."""
    drafted = {w: plain + draft + per_position * (w - 1) for w in widths}
    return CostModel({b: plain for b in buckets}, {b: dict(drafted) for b in buckets})


# Extra positions a ragged step is priced at (at most 15 a row; 0: plain), and widths a drafted step is timed at
# beside the policy's candidates: where a step's cost bends. An int4 target's products cost alike over rows 1-4,
# then 5-8 (about 1.5 more plain steps at 5 rows than at 4 on an Ice Lake), so a line from 4 to 8 priced the runs of
# 4 positions (3 extra) 19 % too dear and grafted trees of 5-7 nodes up to 20 % too cheap.
RAGGED_EXTRA = (0, 1, 2, 3, 4, 8, 16)
TIMED_WIDTHS = (3, 5)

PLAIN = ("width", 1)  # the kind every other is priced against


def step_kinds(widths: list[int], bucket: int, ragged: bool) -> list[tuple[str, int]]:
    """The kinds of step timed in `bucket`: ("width", w) for each width (1: plain), ("extra", e) for each count of
    a ragged step's extra positions up to 15 a row (`ragged`)."""
    extras = [e for e in RAGGED_EXTRA if 0 < e <= 15 * bucket] if ragged else []
    return [("width", w) for w in widths] + [("extra", e) for e in extras]


def measure_costs(time_kinds, widths: list[int], buckets: list[int], ragged: bool = True,
                  watch=lambda: WaitWatch(torch.get_num_threads())) -> CostModel:
    """Time every kind of step in each bucket and price it: `time_kinds(rows, kinds, cycles)` decodes `rows` rows
    taking the `kinds` (`step_kinds`) in turn, step after step, for `cycles` cycles, and returns each kind's
    seconds, one a cycle. Each of `ROUNDS` rounds times `STEPS_PER_ROUND` cycles after `WARM_STEPS` untimed ones
    (`priced`).

    Timed in turn, every kind meets the machine's spells alike, so a kind's cost in plain steps is taken within
    each cycle and its median kept: where each width was timed in a block of its own, a slow spell (another job)
    or a fast one (a 2-core Ice Lake VM ran plain steps at 13 ms for a second and 19-20 ms around it) priced some
    widths and not others. Where a drafted width still timed faster than a plain step, up to EXTRA_ROUNDS more
    rounds run, and a drafted width is never priced below a plain step.

    No statistic of the times saves a bucket timed while another job held the cores at every step, so each
    bucket's timing runs in a `watch()` (cpu_wait.WaitWatch) and the model keeps the share of it that our threads
    waited for a CPU (`CostModel.waited`): measure.py measures a bucket timed busy again on a quiet machine."""
    if 1 not in widths:
        raise ValueError(f"the widths to time must include 1, the plain step every other is priced against: {widths}")
    model = CostModel()
    for bucket in buckets:
        kinds = step_kinds(widths, bucket, ragged)
        times: dict[tuple, list[float]] = {kind: [] for kind in kinds}
        with watch() as waiting:
            for _ in range(ROUNDS):
                _time_round(times, time_kinds, bucket, kinds)
            prices = priced(times)
            for _ in range(EXTRA_ROUNDS):
                if not _faster_than_plain(prices, widths):
                    break
                _time_round(times, time_kinds, bucket, kinds)
                prices = priced(times)
        if waiting.share is not None:
            model.waited[bucket] = waiting.share
        plain = model.plain[bucket] = prices[PLAIN]
        # A drafted step is a plain step's verify plus the draft's forward: it is never cheaper. Priced below one
        # (the plain steps all met slow spells), drafting would look free, and the policy would draft where it loses
        # (the default mode 0.85x the target alone at q4 from one such cache): it is priced as a plain step at least.
        model.drafted[bucket] = {n: max(t, plain) for (kind, n), t in prices.items() if kind == "width" and n > 1}
        if ragged:
            model.ragged[bucket] = {0: plain} | {n: t for (kind, n), t in prices.items() if kind == "extra"}
    return model


def priced(times: dict[tuple, list[float]]) -> dict[tuple, float]:
    """Each kind's price from its seconds, cycle by cycle beside the plain step's (`times[PLAIN]`): the fastest
    plain step, which other work cannot make look slower, times the median over the cycles of the kind's seconds
    over the plain step's."""
    plain = times[PLAIN]
    fastest = min(plain)
    return {kind: fastest * statistics.median(t / p for t, p in zip(seconds, plain))
            for kind, seconds in times.items()}


def _time_round(times: dict, time_kinds, bucket: int, kinds: list[tuple[str, int]]) -> None:
    """One round of `measure_costs`: every kind in turn for WARM_STEPS + STEPS_PER_ROUND cycles in one decode, the
    timed cycles appended to `times`."""
    for kind, seconds in time_kinds(bucket, kinds, WARM_STEPS + STEPS_PER_ROUND).items():
        times[kind] += seconds[WARM_STEPS:]


def _faster_than_plain(prices: dict, widths: list[int]) -> bool:
    """Whether some drafted width was priced under a plain step: the plain ones met only slow spells."""
    return any(prices["width", w] < prices[PLAIN] for w in widths if w > 1)


# A cached plain step this many times slower than one timed now was measured on a busier machine (or another one).
STALE_RATIO = 1.5


def stale_cache_note(cached_plain: float, probe: list[float], rows: int = 1) -> str | None:
    """A line saying the cached costs no longer fit this machine when its plain step of `rows` rows
    `cached_plain` is STALE_RATIO times the fastest of `probe` (such steps timed now), else None. A cache is never
    replaced on a timing: the same request keeps giving the same text until the user measures again."""
    now = min(probe)
    if cached_plain <= STALE_RATIO * now:
        return None
    step = "a plain step" if rows == 1 else f"a plain step of {rows} rows"
    return (f"the cached step costs price {step} at {cached_plain * 1e3:.1f} ms, but it takes {now * 1e3:.1f} ms "
            "now (measured on a busier machine?): speculation may be priced wrong; run once with --measure-costs")


def read_cached(folder: Path, key: str) -> CostModel | None:
    """The cost model cached under `key`, or None (missing or unreadable: it is measured again)."""
    try:
        return CostModel.from_json(json.loads((folder / f"{key}.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_cached(folder: Path, key: str, model: CostModel) -> None:
    """Cache `model` under `key`, written whole or not at all; a cache that cannot be written is skipped (the
    model is then measured again by the next process)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{key}.json.partial"
        partial.write_text(json.dumps(model.to_json(), indent=1))
        partial.replace(folder / f"{key}.json")
    except OSError:
        pass
