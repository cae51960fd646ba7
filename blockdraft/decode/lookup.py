"""Prompt-lookup blocks: continue the context from where its last few tokens occurred before.

Answers that quote their context (constraint lists, code that reuses the prompt's names) repeat spans of it
verbatim, which the draft, seeing the context only through the target's features, often misses. A lookup proposes
the tokens that followed the earlier occurrence of the row's last `min_ngram` tokens sharing the longest suffix
with the row (up to `max_ngram`; the most recent among equals). Verified like any block, so greedy output stays
the target's own; under sampling a lookup proposal is a point mass (q = one-hot), exact (docs/design.md §3).

With token trees (tree.py) each row's run is grafted onto the draft's tree (`graft_length`: how many tokens), or
verified alone on a plain step where that commits faster (`ragged_lengths`, `ragged_plan`; docs/design.md §9).
Without trees, a lookup block replaces the draft's when every live row has a match and the lookup's own width
policy (policy.py) expects a rate at least the draft's; it does not run the draft, whose pending context waits.
Where the context holds no earlier occurrence, the draft's n-gram table (ngrams.py) may supply the run, its
acceptance learnt by a policy of its own. The search itself (continuation.py) is NumPy over each row's context.

Shapes: B live rows, C token capacity, n proposals.
"""

from __future__ import annotations

import torch

from .continuation import MAX_NGRAM, STRENGTH_PRIORS, lookup_block, strength_class
from .costs import CostModel
from ..io.ngrams import RUN as TABLE_RUN, NgramTable
from .policy import FADE, AdaptiveWidth, budgeted_interval


class PromptLookup:
    """Chooses between the draft's block and a lookup block each step, and owns the lookup's width policy."""

    def __init__(self, block_size: int, costs: CostModel | None = None, *, policy=None, max_ngram: int = MAX_NGRAM,
                 min_ngram: int = 2, width: int | None = None, explore_every: int = 16,
                 explore_budget: float = 0.02, table: NgramTable | None = None) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.block_size = block_size
        # A lookup block is not bounded by the draft's slots: 2K by default (anchor included), as wide as a tree.
        self.width = 2 * block_size if width is None else width
        if policy is None and costs is None:
            raise TypeError("a PromptLookup needs a CostModel (decode/costs.py) or a width policy of its own")
        # Its blocks run no draft: priced as plain steps over more positions.
        self.policy = AdaptiveWidth(self.width, costs, drafts=False) if policy is None else policy
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.table = table  # the draft's n-gram table (ngrams.py): runs for rows the context has none for
        # Table runs hit otherwise than copies of the context: their acceptance is learnt apart. `current` is the
        # policy of the runs found last (the table's when every run came from it).
        self.table_policy = AdaptiveWidth(self.width, costs, drafts=False) if table is not None and costs else None
        # Runs onto a plain step are priced row by row (`ragged_lengths`), a prompt run by its strength class's own
        # record (STRENGTHS), from its measured prior: `row_policies` holds, per row of the runs found last, the policy
        # its run is priced by (None: no run). A policy passed in prices every run.
        self.strength_policies = ([AdaptiveWidth(self.width, costs, drafts=False, prior=p) for p in STRENGTH_PRIORS]
                                  if policy is None else None)
        self.row_policies: list = []
        self.current = self.policy
        self.steps = 0  # lookup steps taken (tree steps with a graft among them)
        self.explore_every, self.explore_budget = explore_every, explore_budget
        self.since_graft = 0  # tree steps that declined a graft since the last one
        self._planned: dict = {}  # graft_length's choice by what it depends on (`_plan_graft`)
        self._declined: dict = {}  # by source policy: `since_graft` when a due re-try could not win
        self.fruitless = 0  # searches in a row that grafted nothing (`searched`)
        self.resting = 0  # steps left to skip before the next search

    def propose(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Lookup proposals [B, W-1] (W = `width`) and their lengths [B] when every row has a match, else None."""
        found = self.runs(tokens, lengths)
        return found if found is not None and bool((found[1] > 0).all()) else None

    def runs(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Lookup proposals [B, W-1] and their lengths [B] (0: no match) when any row has a match, else None: each
        row's continuation of an earlier occurrence in its context, else (with a `table`) the table's."""
        self.current = self.policy
        shared: list[int] = []
        if self.table is None:
            found = lookup_block(tokens, lengths, self.width - 1, self.max_ngram, self.min_ngram, shared)
            self._price_rows(shared, found)
            return found
        rows, lengths = tokens.cpu(), lengths.cpu()  # once: both sources read the rows on the CPU
        found = lookup_block(rows, lengths, self.width - 1, self.max_ngram, self.min_ngram, shared)
        table_only = found is None
        found = self._table_runs(found, rows, lengths)
        self._price_rows(shared, found)
        if found is None:
            return None
        if table_only and self.table_policy is not None:
            self.current = self.table_policy
        return found[0].to(tokens.device), found[1].to(tokens.device)

    def _price_rows(self, shared: list[int], found) -> None:
        """`row_policies` for the runs `found` (None: no run anywhere), the rows' shared suffixes `shared` (0: the
        row's run, if any, is the table's)."""
        counts = found[1].tolist() if found is not None else [0] * len(shared)
        table = self.table_policy or self.policy
        self.row_policies = [
            None if not count else self.policy if self.strength_policies is None
            else self.strength_policies[strength_class(suffix)] if suffix else table
            for count, suffix in zip(counts, shared)]

    def _table_runs(self, found, rows: torch.Tensor, lengths: torch.Tensor):
        """`found` (or nothing) with the table's continuation in each row that has no run (ngrams.py), on the CPU:
        rows [B, C] and lengths [B] are there."""
        B, width = rows.shape[0], self.width - 1
        proposals, counts = (found[0].clone(), found[1].clone()) if found is not None else (
            torch.zeros(B, width, dtype=torch.long), torch.zeros(B, dtype=torch.long))
        reach = max(self.table.orders)
        for b, (length, count) in enumerate(zip(lengths.tolist(), counts.tolist())):
            if count:
                continue
            run = self.table.continuation(rows[b, max(length - reach, 0): length].tolist(), min(TABLE_RUN, width))
            if run:
                proposals[b, : len(run)] = torch.tensor(run)
                proposals[b, len(run):] = run[-1]
                counts[b] = len(run)
        return (proposals, counts) if bool(counts.any()) else None

    def may_search(self) -> bool:
        """Whether to look up the rows' runs this step (else the step rests: see `searched`)."""
        if self.resting > 0:
            self.resting -= 1
            return False
        return True

    def searched(self, grafted: bool, rows: int) -> None:
        """A search over `rows` rows' contexts ran and `grafted` a run or not. After n searches in a row that grafted
        nothing, the next min(2^(n-1), rows) - 1 steps skip theirs: a search costs each row about as much at any
        batch size (60 us of SmolLM2's 1.8 ms a row at 8 q4 rows, EPYC Zen 5), while a wide batch's plain step is
        so cheap a row that its grafts seldom pay (2 of 113 searches at 8 rows, 8 HumanEval answers); one row
        searches at every step. Counted in steps, never timed: the same request searches at the same steps."""
        self.fruitless = 0 if grafted else self.fruitless + 1
        self.resting = 0 if grafted else min(2 ** (self.fruitless - 1), rows) - 1

    def graft_length(self, draft_policy, width: int, available: int, rows: int = 1,
                     runs: list[int] | None = None) -> int:
        """How many looked-up tokens (0..available) of the runs found last to graft onto the draft's tree of
        `width` nodes over `rows` rows (step.py); `runs`: each row's run length (None: every row's is `available`).

        Each grafted token costs one more verified position (`seconds_per_position` of the draft's policy) and
        is counted as adding the tokens the lookup gets accepted on its own (the E of the runs' source, from its
        grafted runs; an overestimate where the two agree, when the run merges into the tree at no cost):

            m* = argmax_m (E_tree(width) + E_lookup(m + 1) - 1) / (t_tree(width) + m * c)

        A run grafted onto a plain step (width 1) runs no draft: each row verifies its own run, up to m tokens, in
        a ragged chain (step.py), and a row without one its anchor alone. That step is priced by the rows' mean:

            m* = argmax_m (1 + mean_b E_lookup(min(r_b, m) + 1) - 1) / (t(1) + mean_b min(r_b, m) * c)

        A fixed-width draft policy cannot say, and gets the whole run; so does every `explore_every`-th step
        without a graft, so that a lookup that starts to hit is noticed, or less often where that re-measurement
        would cost more than `explore_budget` of the decode time (shared by a batch's rows, as the width policy's).
        """
        return self._length(self.current, draft_policy, width, available, rows, runs)

    def policies(self) -> tuple:
        """The lookup's width policies: prompt runs' (pooled, and by strength class), and the table runs' where it
        has a table."""
        extra = (self.table_policy,) if self.table_policy is not None else ()
        return (self.policy, *(self.strength_policies or ()), *extra)

    def ragged_lengths(self, draft_policy, runs: list[int], rows: int) -> list[int]:
        """How many tokens of each row's run (runs[b] long, of the runs found last) to graft onto a plain step of
        `rows` rows, verified as a ragged chain (step.py).

        Each looked-up token is a candidate position worth the probability that it is accepted: the product of
        its run's slot acceptances up to it, from the record of the run's policy (`row_policies`: a prompt run's
        strength class, or the table's). The step verifies the E likeliest candidates (a prefix of each row's
        run, as the probabilities fall along it), E chosen for the most expected tokens per second:

            E* = argmax_E (rows + sum of the E largest probabilities) / t_ragged(rows, E)

        with t_ragged measured (costs.py: an int4 product costs rows in blocks, so a few more positions can cost
        nothing and one more a whole block) and drafting's margin to win. Where E* is 0 for long, a re-try
        verifies the likeliest candidate alone, as often as `explore_budget` allows. A fixed-width draft policy
        cannot price it: whole runs."""
        return self.ragged_plan(draft_policy, runs, rows)[0]

    def ragged_plan(self, draft_policy, runs: list[int], rows: int) -> tuple[list[int], float]:
        """(`ragged_lengths`, the expected tokens per second of that ragged step; 0.0 where no run is verified or
        a fixed-width draft policy cannot price it)."""
        costs = getattr(draft_policy, "costs", None)
        if not isinstance(draft_policy, AdaptiveWidth) or costs is None:
            return [0 if policy is None else run for policy, run in zip(self.row_policies, runs)], 0.0
        reach: dict = {}  # policy -> P(slots 1..j all accepted), j = 1..W-1
        candidates = []  # (probability, row, slot)
        for row, (policy, run) in enumerate(zip(self.row_policies, runs)):
            if policy is None or not run:
                continue
            if policy not in reach:
                reach[policy] = torch.cumprod(policy.alpha(), 0).tolist()
            candidates += [(reach[policy][slot], row, slot) for slot in range(min(run, self.width - 1))]
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        plain = costs.ragged_seconds(rows, 0)
        best, best_rate, total = 0, rows / plain * draft_policy.margin, float(rows)
        for extra, (probability, _, _) in enumerate(candidates, start=1):
            total += probability
            rate = total / costs.ragged_seconds(rows, extra)
            if rate > best_rate:
                best, best_rate = extra, rate
        if best == 0 and candidates:
            lost = costs.ragged_seconds(rows, 1) - plain
            if self.since_graft >= budgeted_interval(self.explore_every, lost, plain, self.explore_budget, rows):
                best = 1
        lengths = [0] * len(runs)
        for _, row, _ in candidates[:best]:
            lengths[row] += 1
        rate = (rows + sum(c[0] for c in candidates[:best])) / costs.ragged_seconds(rows, best) if best else 0.0
        return lengths, rate

    def graft_rate(self, draft_policy, width: int, available: int, rows: int = 1,
                   runs: list[int] | None = None) -> float:
        """The expected tokens per second of the draft's tree of `width` nodes with the best graft of the runs
        found last (`graft_length`'s choice, re-tries of whole runs aside); without a graft that pays, the tree's
        own rate."""
        policy = self.current
        if not isinstance(draft_policy, AdaptiveWidth) or not isinstance(policy, AdaptiveWidth):
            return 0.0
        whole = min(available, self.width - 1)
        return self._plan_graft(policy, draft_policy, width, available, rows, whole, (whole,))[2][2]

    def may_graft(self, draft_policy, width: int, rows: int = 1) -> bool:
        """Whether some source's full-length run would be grafted (asked before searching: a lookup over every
        row's context costs a few percent of a batched plain step)."""
        return any(self._length(policy, draft_policy, width, self.width - 1, rows) > 0 for policy in self.policies())

    def _length(self, policy, draft_policy, width: int, available: int, rows: int,
                runs: list[int] | None = None) -> int:
        whole = min(available, self.width - 1)
        if not isinstance(draft_policy, AdaptiveWidth) or not isinstance(policy, AdaptiveWidth):
            return whole  # a fixed width cannot price a graft
        # Each row's run, as far as it can count: onto a plain step its own; onto a tree every row's m nodes.
        runs = tuple(min(r, whole) for r in runs) if width == 1 and runs is not None else (whole,)
        # The choice changes only with either policy's counts: a decode asks the same question at most steps.
        key = (draft_policy, draft_policy.version, policy, policy.version, width, available, rows, runs,
               self.explore_every, self.explore_budget)
        if key not in self._planned:
            if len(self._planned) > 256:
                self._planned.clear()
            self._planned[key] = self._plan_graft(policy, draft_policy, width, available, rows, whole, runs)
        best, interval, (tree_gain, whole_seconds, best_rate) = self._planned[key]
        if self.since_graft < self._declined.get(policy, 0) + interval or whole == best:
            return best
        # A whole-run re-try only where the run could win at an optimistic acceptance (policy.py, `could_win`),
        # its counts faded over the steps since the last graft; where it cannot, asked again after another
        # interval, as the width policy does, not at every step until it can.
        fade = FADE ** self.since_graft
        optimistic = tree_gain + _mean(policy.optimistic_gain(min(r, whole) + 1, fade=fade) - 1 for r in runs)
        if optimistic / whole_seconds > best_rate:
            return whole
        self._declined[policy] = self.since_graft
        return best

    def _plan_graft(self, policy, draft_policy, width: int, available: int, rows: int, whole: int,
                    runs: tuple[int, ...]) -> tuple[int, float, tuple[float, float, float]]:
        """(the graft length with the most expected tokens per second, steps between whole-run re-tries, and for
        judging a re-try: the tree's E, a whole run's step seconds, the best length's tokens per second), for
        rows whose runs count `runs` tokens (one entry: every row's)."""
        cost = draft_policy.seconds_per_position()
        # The tree's expected step time, as its own policy judges it (without a graft, a plain step stays plain).
        seconds = draft_policy.step_seconds(width)

        def step_time(m: int) -> float:  # a row verifies min(r, m) more positions (a tree: every row m)
            return seconds + _mean(min(r, m) for r in runs) * cost

        tree_gain, gain = float(draft_policy.gains()[width - 1]), policy.gains().tolist()  # gain[m]: E(m + 1)

        def tokens(m: int) -> float:
            return tree_gain + _mean(gain[min(r, m)] - 1 for r in runs)

        lengths = sorted({0} | {min(w - 1, available) for w in policy.widths})
        best = max(lengths, key=lambda m: tokens(m) / step_time(m))
        # Seconds a whole-run graft loses against the best length producing the same expected tokens.
        lost = step_time(whole) - tokens(whole) / tokens(best) * step_time(best)
        interval = budgeted_interval(self.explore_every, lost, step_time(best), self.explore_budget, rows)
        return best, interval, (tree_gain, step_time(whole), tokens(best) / step_time(best))

    def observe_graft(self, graft: int, accepted: list[int], runs: list[int] | None = None,
                      by_row: bool = False) -> None:
        """A tree step grafted `graft` looked-up tokens (0: none); row r's run had accepted[r] of them accepted,
        of runs[r] it held (None: all `graft`). `by_row`: each row's run is recorded by its own policy
        (`row_policies`: a ragged step), a prompt run's in the pooled record too; else all by `current`."""
        self.since_graft = 0 if graft else self.since_graft + 1
        if not graft:
            return
        self._declined.clear()
        self.steps += 1
        if not by_row:
            self.current.record(graft + 1, accepted, reach=runs)
            return
        runs = runs if runs is not None else [graft] * len(accepted)
        groups: dict = {}  # policy -> rows
        for row, policy in enumerate(self.row_policies):
            if policy is not None and runs[row]:
                groups.setdefault(policy, []).append(row)
                if policy in (self.strength_policies or ()):
                    groups.setdefault(self.policy, []).append(row)
        for policy, rows in groups.items():
            policy.record(graft + 1, [accepted[r] for r in rows], reach=[runs[r] for r in rows])

    def preferred_over(self, draft_policy) -> bool:
        """Whether a lookup step is expected to commit tokens at least as fast as the draft's policy would; a
        fixed-width draft policy cannot say, and leaves the lookup preferred (a match is the stronger signal)."""
        if not isinstance(draft_policy, AdaptiveWidth) or not isinstance(self.current, AdaptiveWidth):
            return True
        return self.current.best_rate() >= draft_policy.best_rate()


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)
