"""Verify widths per step: any width sequence keeps greedy output exact; the adaptive policy picks well."""

from __future__ import annotations

import pytest
import torch

from blockdraft.decode.generate import generate
from blockdraft.decode.policy import (AdaptiveWidth, FixedWidth, TreeWidth, batch_bucket, candidate_widths,
                                     expected_tokens, make_policy, smoothed_time)
from blockdraft.metrics import AcceptanceStats

from conftest import COSTS, ScriptedDrafter, tiny_draft, tiny_target
from test_sampling_decode import CyclingWidth
from test_lookup import AlternatingLookup

PROMPTS = [[1, 5, 9, 13, 17], [3, 4], [7, 8, 9, 10, 11, 12, 13, 14, 15]]


def test_expected_tokens_and_candidates():
    assert expected_tokens(torch.tensor([1.0, 1.0, 1.0])).tolist() == [1, 2, 3, 4]
    assert expected_tokens(torch.tensor([0.5, 0.5])).tolist() == [1, 1.5, 1.75]
    assert candidate_widths(8) == [1, 2, 4, 8] and candidate_widths(10) == [1, 2, 4, 8, 10]
    assert candidate_widths(2) == [1, 2]
    assert isinstance(make_policy(8, False), FixedWidth) and isinstance(make_policy(8, True, COSTS), AdaptiveWidth)
    custom = CyclingWidth(4)
    assert make_policy(4, custom) is custom


def test_stats_count_only_the_slots_a_step_had():
    stats = AcceptanceStats(4)
    stats.record(1, 1)  # a plain step: no slot reached
    stats.record(3, 4)  # slots 1, 2 accepted, slot 3 reached and rejected
    stats.record(2, 2)  # width 2: its one slot accepted, nothing beyond it reached
    assert stats.plain_steps == 1 and stats.tokens == 6 and stats.histogram == [1, 1, 1, 0]
    assert stats.slot_reached == [2, 1, 1] and stats.slot_accepted == [2, 1, 0]
    assert stats.per_position_acceptance() == [1.0, 1.0, 0.0]
    merged = stats.merge(stats)
    assert merged.slot_reached == [4, 2, 2] and merged.plain_steps == 2


def simulate(policy: AdaptiveWidth, steps: int, accept_rate, seconds) -> list[int]:
    """Drive the policy with rows that accept each proposal with probability accept_rate(step)."""
    generator = torch.Generator().manual_seed(0)
    chosen = []
    for i in range(steps):
        width = policy.choose()
        accepted = []
        for _ in range(4):  # four rows
            a = 0
            while a < width - 1 and torch.rand((), generator=generator) < accept_rate(i):
                a += 1
            accepted.append(a)
        policy.observe(width, accepted, seconds(width))
        chosen.append(width)
    return chosen


def cpu_like_cost(width: int) -> float:
    return 1.0 + (0.3 + 0.05 * width if width > 1 else 0.0)  # drafting has a fixed cost, verify grows with w


def test_adaptive_falls_back_to_plain_steps_when_drafts_miss():
    chosen = simulate(AdaptiveWidth(8, COSTS), 400, lambda i: 0.05, cpu_like_cost)
    plain = chosen[100:].count(1) / 300
    assert plain > 0.85, f"a draft that is almost never right must not be used, plain share {plain:.2f}"
    assert set(chosen[100:]) - {1}, "a drafting width is still re-measured now and then"


def test_adaptive_uses_the_full_block_when_drafts_hit():
    chosen = simulate(AdaptiveWidth(8, COSTS), 300, lambda i: 0.95, cpu_like_cost)
    assert chosen[100:].count(8) / 200 > 0.85


def test_a_draft_near_break_even_is_re_measured_often():
    # Width 2 costs 1.4 steps: at acceptance 0.36 it is expected within 5 % of plain steps, a near tie, so it
    # is re-measured every `explore_close` steps; far from a tie (acceptance 0.05) only every `explore_every`.
    near = simulate(AdaptiveWidth(8, COSTS), 400, lambda i: 0.36, cpu_like_cost)[100:]
    far = simulate(AdaptiveWidth(8, COSTS), 400, lambda i: 0.05, cpu_like_cost)[100:]
    assert sum(w > 1 for w in near) >= 300 // 8 - 2, "a near tie is re-measured at least every 8 steps"
    assert sum(w > 1 for w in far) <= 300 // 32 + 2, "a draft far from paying is re-measured rarely"


def test_adaptive_notices_when_drafting_starts_to_pay():
    # Bad for 200 steps, then good: the re-measured widths pick up the new acceptance.
    chosen = simulate(AdaptiveWidth(8, COSTS), 400, lambda i: 0.05 if i < 200 else 0.95, cpu_like_cost)
    assert chosen[150:200].count(1) > 40 and chosen[300:].count(8) > 85


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cycled_widths_keep_greedy_output_exact(family):
    target = tiny_target(family)
    base = generate(target, None, PROMPTS, max_new_tokens=60, stop_token_ids=[])
    reference = [p + r.tokens for p, r in zip(PROMPTS, base)]
    for drafter in (tiny_draft(target, block_size=8), ScriptedDrafter(reference, 8)):
        spec = generate(target, drafter, PROMPTS, max_new_tokens=44,
                        stop_token_ids=[], adaptive=CyclingWidth(8))
        for b, s in zip(base, spec):
            assert s.tokens == b.tokens[:44], "a step of another width changed the target's greedy output"
        assert spec[0].stats.plain_steps > 0


def test_adaptive_greedy_is_exact_and_reports_its_steps():
    target = tiny_target("llama")
    base = generate(target, None, PROMPTS, max_new_tokens=48, stop_token_ids=[])
    reference = [p + r.tokens for p, r in zip(PROMPTS, base)]
    for drafter in (tiny_draft(target, block_size=8), ScriptedDrafter(reference, 8)):
        spec = generate(target, drafter, PROMPTS, max_new_tokens=40, stop_token_ids=[], adaptive=True)
        for b, s in zip(base, spec):
            assert s.tokens == b.tokens[:40]
            assert s.stats.steps == sum(s.stats.histogram) and s.stats.plain_steps <= s.stats.steps


def test_join_pending_appends_each_rows_entries():
    from blockdraft.decode.step import join_pending

    old = torch.tensor([[[1.0], [2.0], [0.0]], [[5.0], [0.0], [0.0]]])  # counts 2 and 1 (0 is padding)
    new = torch.tensor([[[3.0], [9.0]], [[6.0], [7.0]]])  # counts 1 and 2
    joined, counts = join_pending(old, torch.tensor([2, 1]), new, torch.tensor([1, 2]))
    assert counts.tolist() == [3, 3]
    assert joined[0, :3, 0].tolist() == [1, 2, 3] and joined[1, :3, 0].tolist() == [5, 6, 7]


@pytest.mark.parametrize("with_lookup", [False, True], ids=["plain-steps", "plain-and-lookup-steps"])
def test_draft_context_after_plain_steps_equals_a_fresh_one(with_lookup):
    """Plain and lookup steps defer the draft's context; the next proposal must see exactly the committed prefix."""
    from blockdraft.decode.drafter import Drafter

    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=8)
    checked = []

    class Checked(Drafter):
        def propose(self, anchors, anchor_positions, slots=None):
            logits = super().propose(anchors, anchor_positions, slots)
            s = int(anchor_positions[0])
            assert int(self.cache.lengths[0]) == s, "the draft cache must hold positions 0..s-1"
            prefix = committed[0][:s]
            features = target.forward(torch.tensor([prefix]), torch.arange(s)[None], target.new_cache(1, s),
                                      self.tap_layer_ids).features
            fresh = Drafter(draft, target)
            fresh.start(1, s + 8)
            fresh.append_context(features, torch.tensor([s]))
            expected = fresh.propose(anchors[:1], anchor_positions[:1])  # all K-1 slots
            assert logits.shape[1] == slots  # the head scored only the slots this step verifies
            torch.testing.assert_close(logits[:1], expected[:, :slots], rtol=1e-4, atol=1e-4)
            checked.append(s)
            return logits

    base = generate(target, None, PROMPTS[:1], max_new_tokens=40, stop_token_ids=[])[0]
    committed = [PROMPTS[0] + base.tokens]
    lookup = AlternatingLookup(8) if with_lookup else False
    out = generate(target, Checked(draft, target), PROMPTS[:1], max_new_tokens=30, stop_token_ids=[],
                   adaptive=CyclingWidth(8), lookup=lookup)[0]
    assert out.tokens == base.tokens[:30] and len(checked) >= 3 and out.stats.plain_steps >= 2
    assert out.stats.lookup_steps >= 2 if with_lookup else out.stats.lookup_steps == 0


def test_the_cost_of_a_verified_position_is_fitted_from_drafted_steps():
    policy = AdaptiveWidth(8, COSTS)
    assert policy.seconds_per_position() is None, "nothing timed yet"
    for width in policy.widths:  # slow first timings, which the fit leaves out
        policy.observe_cost(width, 0.100)
        policy.observe(width, [0], 0.100)
    for width in policy.widths:  # stale timings: a slope of 1 ms per position
        policy.observe_cost(width, 0.010 + 0.001 * width)
        policy.observe(width, [0], 0.010 + 0.001 * width)
    assert abs(policy.seconds_per_position() - 0.001) < 1e-9
    for positions in [2, 9, 16, 23] * 10:  # drafted steps: 20 ms plus 0.4 ms per verified position
        policy.observe_cost(positions, 0.020 + 0.0004 * positions)
    assert abs(policy.seconds_per_position() - 0.0004) < 1e-9, "the fit replaces the two-width slope"
    assert abs(policy.step_seconds(8) - 0.0232) < 1e-4, "drafted widths are timed by the fitted line"
    assert policy.step_seconds(1) == policy.seconds[1], "a plain step by its own measurement"


def test_step_times_are_kept_per_batch_size():
    # One row: drafting is cheap and pays. Four rows: the same drafted widths cost several plain steps.
    policy = AdaptiveWidth(8, COSTS)
    one = simulate_at(policy, 1, 200, 0.7, lambda w: 1.0 + (0.1 + 0.02 * w if w > 1 else 0.0))
    four = simulate_at(policy, 4, 200, 0.7, lambda w: 1.0 + (1.0 + 0.5 * w if w > 1 else 0.0))
    assert one[100:].count(8) > 85 and four[100:].count(1) > 85, "each batch size is judged by its own step times"
    assert policy.measurements[1] >= 100 and set(policy.times) == {1, 4}
    policy.at_batch(1)
    assert policy.choose() in (8, 4), "back at one row, its own times hold again"
    assert [policy.times.get(b) is not None for b in (2, 3)] == [False, False] and batch_bucket(3) == 4


def simulate_at(policy: AdaptiveWidth, rows: int, steps: int, accept: float, seconds) -> list[int]:
    generator = torch.Generator().manual_seed(rows)
    chosen = []
    for _ in range(steps):
        policy.at_batch(rows)
        width = policy.choose()
        accepted = [int((torch.rand(width - 1, generator=generator) < accept).long().cumprod(0).sum())
                    for _ in range(rows)]
        policy.observe(width, accepted, seconds(width))
        chosen.append(width)
    return chosen


def test_re_measurements_stay_within_their_time_budget():
    # A useless draft whose drafted steps cost 1.3-1.7 plain steps (one row) or 4-20 (a batch): the first is
    # re-measured every `explore_every` steps, the second only as often as 2 % of the decode time allows.
    cheap = simulate(AdaptiveWidth(8, COSTS), 1000, lambda i: 0.0, cpu_like_cost)[100:]
    costly = simulate(AdaptiveWidth(8, COSTS), 1000, lambda i: 0.0, lambda w: 1.0 + (3.0 + 2.0 * w if w > 1 else 0.0))[100:]
    assert sum(w > 1 for w in cheap) >= 900 // 32 - 2
    drafted = [w for w in costly if w > 1]
    lost = sum(3.0 + 2.0 * w for w in drafted)  # seconds beyond the plain steps they replaced (they accept nothing)
    assert drafted and lost <= 0.02 * len(costly) * 1.1, f"re-measuring cost {lost:.1f} s of {len(costly)} s"


def test_a_new_batch_size_starts_from_the_nearest_timed_one():
    policy = AdaptiveWidth(8, COSTS)
    simulate_at(policy, 4, 60, 0.1, lambda w: 1.0 + (1.0 + 0.5 * w if w > 1 else 0.0))  # drafting is dear at 4 rows
    policy.at_batch(1)  # the batch's rows finish: one left
    assert policy.seconds == policy.times[4].seconds and policy.choose() == 1, \
        "no re-timing of every width: the 4-row times say plain steps"
    policy.observe(1, [0], 0.5)
    policy.at_batch(1)
    assert policy.seconds[1] == 0.5 and policy.times[4].seconds[1] != 0.5, \
        "its own first time replaces the borrowed one"
    policy.at_batch(1)
    policy.observe(8, [7], 0.6)
    assert policy.seconds[8] == 0.6 and 8 not in policy.times[1].borrowed and policy.times[1].timed(8), \
        "a re-measured width is judged by its own time at once, without being timed a second time first"


def test_step_times_shrug_off_spikes_and_follow_lasting_changes():
    assert smoothed_time(None, 0, 0.030, 0.3) == 0.030
    assert smoothed_time(0.030, 1, 0.010, 0.3) == 0.010, "a first step's one-off cost is dropped"
    assert smoothed_time(0.010, 1, 0.030, 0.3) == 0.010, "a spike on the second step is not taken instead"
    assert smoothed_time(0.010, 5, 0.100, 0.3) == pytest.approx(0.0115), "one slow step moves it by 15 % at most"
    assert smoothed_time(0.030, 5, 0.010, 0.3) == pytest.approx(0.018), "a faster step weighs double"
    estimate = 0.010
    for count in range(2, 22):  # the machine stays twice as slow: followed within a few steps
        estimate = smoothed_time(estimate, count, 0.020, 0.3)
    assert estimate == pytest.approx(0.020, rel=0.01)


@pytest.mark.parametrize("policy_class", [AdaptiveWidth, TreeWidth])
def test_a_slow_early_plain_step_is_re_measured_while_drafting_wins(policy_class):
    # The first two plain steps ran 3x slow (a cold start): judged by them, a draft that accepts little looks
    # better than plain steps, which no drafted step re-times. Re-measuring plain steps now and then corrects it.
    plain = iter([3.0, 3.0])
    chosen = simulate(policy_class(8), 600, lambda i: 0.1, lambda w: next(plain, 1.0) if w == 1 else cpu_like_cost(w))
    assert chosen[300:].count(1) / 300 > 0.8, "plain steps win once their real time is known"
    fast = simulate(policy_class(8), 600, lambda i: 0.95, cpu_like_cost)[100:]
    assert 0 < fast.count(1) <= 0.02 * len(fast), "while drafting wins a plain step is re-measured, rarely"
