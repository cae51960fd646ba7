"""Verify widths per step: any width sequence keeps greedy output exact; the adaptive policy picks well."""

from __future__ import annotations

import pytest
import torch

from blockdraft.decode.generate import generate

from blockdraft.decode.proposers import TargetAlone
from blockdraft.decode.costs import CostModel
from blockdraft.decode.policy import (AdaptiveWidth, FixedWidth, TreeWidth, candidate_widths, expected_tokens,
                                     make_policy)
from blockdraft.metrics import AcceptanceStats

from step_fakes import AlternatingLookup, COSTS, CyclingWidth, ScriptedDrafter, own_proposer, proposer
from tiny_models import tiny_draft, tiny_target

PROMPTS = [[1, 5, 9, 13, 17], [3, 4], [7, 8, 9, 10, 11, 12, 13, 14, 15]]


def test_expected_tokens_and_candidates():
    assert expected_tokens(torch.tensor([1.0, 1.0, 1.0])).tolist() == [1, 2, 3, 4]
    assert expected_tokens(torch.tensor([0.5, 0.5])).tolist() == [1, 1.5, 1.75]
    assert candidate_widths(8) == [1, 2, 4, 8] and candidate_widths(10) == [1, 2, 4, 8, 10]
    assert candidate_widths(2) == [1, 2]
    assert isinstance(make_policy(8, False), FixedWidth) and isinstance(make_policy(8, True, COSTS), AdaptiveWidth)


def test_stats_count_only_the_slots_a_step_had():
    stats = AcceptanceStats(4)
    stats.record(1, 1)  # a plain step: no slot reached
    stats.record(3, 4)  # slots 1, 2 accepted, slot 3 reached and rejected
    stats.record(2, 2)  # width 2: its one slot accepted, nothing beyond it reached
    assert stats.plain_steps == 1 and stats.tokens == 6 and stats.histogram == [1, 1, 1, 0, 0]
    assert stats.slot_reached == [2, 1, 1] and stats.slot_accepted == [2, 1, 0]
    assert stats.per_position_acceptance() == [1.0, 1.0, 0.0]
    merged = stats.merge(stats)
    assert merged.slot_reached == [4, 2, 2] and merged.plain_steps == 2


def costs_of(seconds, buckets=(1,)) -> CostModel:
    """A cost model whose steps of width w take seconds(w) in every bucket."""
    return CostModel({b: seconds(1) for b in buckets}, {b: {w: seconds(w) for w in (2, 4, 8)} for b in buckets})


def simulate(policy: AdaptiveWidth, steps: int, accept_rate) -> list[int]:
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
        policy.observe(width, accepted)
        chosen.append(width)
    return chosen


def cpu_like_cost(width: int) -> float:
    return 1.0 + (0.3 + 0.05 * width if width > 1 else 0.0)  # drafting has a fixed cost, verify grows with w


CPU_LIKE = costs_of(cpu_like_cost)


def test_adaptive_falls_back_to_plain_steps_when_drafts_miss():
    chosen = simulate(AdaptiveWidth(8, CPU_LIKE), 400, lambda i: 0.05)
    plain = chosen[100:].count(1) / 300
    assert plain > 0.85, f"a draft that is almost never right must not be used, plain share {plain:.2f}"
    assert set(chosen[100:]) - {1}, "a drafting width is still re-measured now and then"


def test_adaptive_uses_the_full_block_when_drafts_hit():
    chosen = simulate(AdaptiveWidth(8, CPU_LIKE), 300, lambda i: 0.95)
    assert chosen[100:].count(8) / 200 > 0.85


def test_a_draft_near_break_even_is_re_measured_often():
    # Width 2 costs 1.4 steps: at acceptance 0.36 it is expected within 5 % of plain steps, a near tie, so it
    # is re-measured every `explore_close` steps; far from a tie (acceptance 0.05) only every `explore_every`.
    near = simulate(AdaptiveWidth(8, CPU_LIKE), 400, lambda i: 0.36)[100:]
    far = simulate(AdaptiveWidth(8, CPU_LIKE), 400, lambda i: 0.05)[100:]
    assert sum(w > 1 for w in near) >= 300 // 8 - 2, "a near tie is re-measured at least every 8 steps"
    assert sum(w > 1 for w in far) <= 300 // 32 + 2, "a draft far from paying is re-measured rarely"


def test_adaptive_notices_when_drafting_starts_to_pay():
    # Bad for 200 steps, then good: the re-measured widths pick up the new acceptance.
    chosen = simulate(AdaptiveWidth(8, CPU_LIKE), 400, lambda i: 0.05 if i < 200 else 0.95)
    assert chosen[150:200].count(1) > 40 and chosen[300:].count(8) > 85


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cycled_widths_keep_greedy_output_exact(family):
    target = tiny_target(family)
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=60, stop_token_ids=[])
    reference = [p + r.tokens for p, r in zip(PROMPTS, base)]
    for drafter in (tiny_draft(target, block_size=8), ScriptedDrafter(reference, 8)):
        spec = generate(target, own_proposer(target, drafter, CyclingWidth(8)), PROMPTS, max_new_tokens=44,
                        stop_token_ids=[])
        for b, s in zip(base, spec):
            assert s.tokens == b.tokens[:44], "a step of another width changed the target's greedy output"
        assert spec[0].stats.plain_steps > 0


def test_adaptive_greedy_is_exact_and_reports_its_steps():
    target = tiny_target("llama")
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=48, stop_token_ids=[])
    reference = [p + r.tokens for p, r in zip(PROMPTS, base)]
    for drafter in (tiny_draft(target, block_size=8), ScriptedDrafter(reference, 8)):
        spec = generate(target, proposer(target, drafter, adaptive=True), PROMPTS, max_new_tokens=40, stop_token_ids=[])
        for b, s in zip(base, spec):
            assert s.tokens == b.tokens[:40]
            assert s.stats.steps == sum(s.stats.histogram) and s.stats.plain_steps <= s.stats.steps


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

    base = generate(target, TargetAlone(), PROMPTS[:1], max_new_tokens=40, stop_token_ids=[])[0]
    committed = [PROMPTS[0] + base.tokens]
    lookup = AlternatingLookup(8) if with_lookup else None
    out = generate(target, own_proposer(target, Checked(draft, target), CyclingWidth(8), lookup), PROMPTS[:1],
                   max_new_tokens=30, stop_token_ids=[])[0]
    assert out.tokens == base.tokens[:30] and len(checked) >= 3 and out.stats.plain_steps >= 2
    assert out.stats.lookup_steps >= 2 if with_lookup else out.stats.lookup_steps == 0


def test_step_costs_are_read_at_the_batch_size_of_the_step():
    # One row: drafting is cheap and pays. Four rows: the same drafted widths cost several plain steps.
    costs = costs_of(lambda w: 1.0 + (0.1 + 0.02 * w if w > 1 else 0.0))
    costs.update(CostModel({4: 1.0}, {4: {w: 2.0 + 0.5 * w for w in (2, 4, 8)}}))
    policy = AdaptiveWidth(8, costs)
    one = simulate_at(policy, 1, 200, 0.7)
    four = simulate_at(policy, 4, 200, 0.7)
    assert one[100:].count(8) > 85 and four[100:].count(1) > 85, "each batch size is judged by its own step times"
    policy.at_batch(1)
    assert policy.choose() in (8, 4), "back at one row, its own costs hold again"


def simulate_at(policy: AdaptiveWidth, rows: int, steps: int, accept: float) -> list[int]:
    generator = torch.Generator().manual_seed(rows)
    chosen = []
    for _ in range(steps):
        policy.at_batch(rows)
        width = policy.choose()
        accepted = [int((torch.rand(width - 1, generator=generator) < accept).long().cumprod(0).sum())
                    for _ in range(rows)]
        policy.observe(width, accepted)
        chosen.append(width)
    return chosen


def test_re_tries_stay_within_their_time_budget():
    # A useless draft whose drafted steps cost 1.3-1.7 plain steps (one row) or 4-20 (a batch): the first is
    # re-tried as its evidence fades (every 60-70 steps here), the second at most as often as 2 % of the decode
    # time allows, and here never: 2 tokens for 8 plain steps' time cannot pay even if every guess were right.
    cheap = simulate(AdaptiveWidth(8, CPU_LIKE), 1000, lambda i: 0.0)[100:]
    costly = simulate(AdaptiveWidth(8, costs_of(lambda w: 1.0 + (3.0 + 2.0 * w if w > 1 else 0.0))), 1000,
                      lambda i: 0.0)[100:]
    assert sum(w > 1 for w in cheap) >= 900 // 100
    drafted = [w for w in costly if w > 1]
    lost = sum(3.0 + 2.0 * w for w in drafted)  # seconds beyond the plain steps they replaced (they accept nothing)
    assert lost <= 0.02 * len(costly) * 1.1, f"re-trying cost {lost:.1f} s of {len(costly)} s"
    assert not drafted, "a width that cannot pay at perfect acceptance is never re-tried"


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_no_budget_is_spent_where_drafting_is_far_from_paying(tree):
    # 8 rows of an int4 target on a CPU (measured): width 2 costs 1.92 plain steps, 16 nodes 10. A draft accepting
    # 35 % cannot pay there; re-tries run only once the faded counts leave room for doubt, and within the budget
    # the 8 rows share: a width-2 chain every couple of hundred steps, trees every few thousand (the widest tree,
    # 8 tokens at most, is never tried).
    ratios = {2: 1.92, 4: 3.05, 8: 5.54, 16: 10.03}
    costs = CostModel({8: 1.0}, {8: ratios})
    policy = TreeWidth(16, costs, slots=7) if tree else AdaptiveWidth(8, costs)
    chosen = simulate_at(policy, 8, 8000, 0.35)[100:]
    lost = sum(ratios[w] - 1 for w in chosen if w > 1)
    assert 16 not in chosen and lost <= 0.01 * len(chosen), f"re-tries cost {lost:.1f} of {len(chosen)} steps"
    assert any(w > 1 for w in chosen), "still re-tried now and then"


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_the_rows_of_a_batch_share_the_re_try_budget(tree):
    # Steps that cost the same relative to a plain step at 1 row and at 8: a re-try of 8 rows observes 8 rows, so
    # the 8 rows' re-tries may cost 2 % / 8 of the decode time (with a budget for the batch: 0.7 % here).
    ratios = {2: 1.5, 4: 2.0, 8: 3.0, 16: 5.0}
    costs = CostModel({1: 1.0, 8: 1.0}, {1: ratios, 8: ratios})
    retries = {}
    for rows in (1, 8):
        policy = TreeWidth(16, costs, slots=7) if tree else AdaptiveWidth(8, costs)
        chosen = simulate_at(policy, rows, 6000, 0.0)[100:]
        retries[rows] = sum(w > 1 for w in chosen)
        lost = sum(ratios[w] - 1 for w in chosen if w > 1)  # they accept nothing: every re-try is lost time
        assert lost <= 0.02 / rows * len(chosen) * 1.1, f"{rows} rows: re-tries cost {lost:.1f} of {len(chosen)} steps"
    assert 0 < retries[8] < retries[1], f"re-tries at 1 and 8 rows: {retries}"


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_widths_never_depend_on_the_clock(monkeypatch, tree):
    """The same request chooses the same widths (and so, in 16-bit floats, rounds the same way) however long its
    steps take: the policy reads its cost model, never a live clock."""
    import itertools
    import time

    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=8)
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=40, stop_token_ids=[])
    reference = [p + r.tokens for p, r in zip(PROMPTS, base)]

    def run():
        runs = []
        for drafter in (draft, ScriptedDrafter(reference, 8)):
            out = generate(target, proposer(target, drafter, tree=tree, adaptive=True, lookup=True), PROMPTS,
                           max_new_tokens=40, stop_token_ids=[])
            runs += [(r.tokens, r.stats.histogram, r.stats.plain_steps, r.stats.lookup_steps) for r in out]
        return runs

    first = run()
    jitter = itertools.cycle([0.0, 5.0, 0.001, 40.0, 0.3])  # a clock that jumps about: steps of any length
    clock = itertools.accumulate(jitter)
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    assert run() == first, "a decode's widths followed the wall clock"


def test_the_first_steps_are_the_widest_so_wide_widths_are_learnt():
    """From the priors alone every width expects the same tokens and the cheapest drafted one would win, which
    tells nothing of wider ones: the opening steps verify the widest, whose acceptance informs every width."""
    from blockdraft.decode.policy import TreeWidth

    for policy in (AdaptiveWidth(8, CPU_LIKE), TreeWidth(8, CPU_LIKE)):
        chosen = []
        for _ in range(3):
            width = chosen.append(policy.choose()) or chosen[-1]
            within = {w: [w - 1] for w in policy.widths if 1 < w <= width}  # every guess accepted
            policy.observe(width, [width - 1], within=within)
        assert chosen[:2] == [policy.widths[-1]] * 2, chosen
        assert chosen[2] == policy.widths[-1], "a draft that hits everything keeps the widest width"


def test_no_opening_where_no_width_pays_at_the_priors():
    """A plain step so cheap that no drafted width pays at the priors' acceptance (an int4 target on a CPU): the
    opening's wide steps would be a loss, so the first steps are plain; re-tries still look for a draft that pays."""
    from blockdraft.decode.policy import TreeWidth

    cheap_plain = costs_of(lambda w: 0.008 if w == 1 else 0.020 + 0.002 * w)  # break-even well above the priors
    for policy in (AdaptiveWidth(8, cheap_plain), TreeWidth(8, cheap_plain)):
        chosen = []
        for _ in range(3):
            chosen.append(policy.choose())
            policy.observe(chosen[-1], [0], within={})
        assert chosen == [1, 1, 1], chosen
    for policy in (AdaptiveWidth(8, CPU_LIKE), TreeWidth(8, CPU_LIKE)):  # where drafting can pay, it opens wide
        assert policy.choose() == policy.widths[-1]


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_memoized_choices_equal_choices_computed_afresh(kind):
    """The policy keeps what it derives from its counts until they change; a policy that derives everything at
    every step must choose the same widths through plain, drafted and re-try steps, and batch-size changes."""
    from blockdraft.decode.costs import linear_costs
    from blockdraft.decode.policy import AdaptiveWidth, TreeWidth

    class Afresh(TreeWidth if kind == "tree" else AdaptiveWidth):
        def _memoized(self, key, compute):
            return compute()

    costs = linear_costs(plain=1.0, draft=0.3, per_position=0.02)
    make = (lambda cls: cls(8, costs)) if kind == "tree" else (lambda cls: cls(8, costs))
    base_cls = TreeWidth if kind == "tree" else AdaptiveWidth
    kept, fresh = make(base_cls), make(Afresh)
    generator = torch.Generator().manual_seed(1)
    widths = []
    for step in range(300):
        rows = 1 + (step // 50) % 3
        for policy in (kept, fresh):
            policy.at_batch(rows)
        width = kept.choose()
        assert fresh.choose() == width, f"step {step}"
        widths.append(width)
        # acceptance falls, then recovers: the choice moves between plain and drafted widths
        good = step < 60 or step > 200
        accepted = [int(torch.randint(0, width, (1,), generator=generator)) if good else 0 for _ in range(rows)]
        within = {w: [min(a, w - 1) for a in accepted] for w in kept.widths if 1 < w <= width}
        for policy in (kept, fresh):
            policy.observe(width, accepted, within=within)
        assert torch.equal(kept.gains(), fresh.gains())
    assert len(set(widths)) > 2 and 1 in widths  # the walk saw plain steps and several drafted widths
