"""Prompt-lookup blocks (decode/lookup.py): the continuation rule, and greedy output that stays the target's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blockdraft.decode.generate import generate

from blockdraft.decode.proposers import TargetAlone
from blockdraft.decode.continuation import lookup_block
from blockdraft.decode.lookup import PromptLookup
from blockdraft.decode.costs import linear_costs
from blockdraft.decode.policy import AdaptiveWidth, FixedWidth, make_policy
from blockdraft.decode.selection import Selector
from blockdraft.sampling import SamplingParams

from step_fakes import AlternatingLookup, COSTS, CyclingWidth, ScriptedDrafter, own_proposer, proposer
from tiny_models import tiny_draft, tiny_target
from exact_sampling import (ALPHA, NUM_ROWS, NUM_TOKENS, exact_joint, final_draw_from_p, goodness_of_fit,
                            joint_counts)

# Repetitive prompts: the tiny targets' greedy answers fall into loops too, so lookups find matches.
PROMPTS = [[1, 5, 9, 13, 17, 5, 9, 13, 17, 5], [3, 4, 3, 4, 3], [7, 8, 9, 10, 11, 12, 13, 14, 15, 7, 8]]


def test_lookup_block_pads_and_counts_each_row():
    tokens = torch.tensor([[1, 2, 9, 1, 2, 0, 0], [4, 5, 6, 7, 0, 0, 0]])
    proposals, found = lookup_block(tokens, torch.tensor([5, 4]), 4)
    assert found.tolist() == [3, 0]
    assert proposals[0].tolist() == [9, 1, 2, 2]  # padded with the row's last proposal
    assert lookup_block(tokens[1:], torch.tensor([4]), 4) is None, "no row has a match"
    assert PromptLookup(5, COSTS).propose(tokens, torch.tensor([5, 4])) is None, "a row without a match: no lookup step"
    assert PromptLookup(5, COSTS).propose(tokens[:1], torch.tensor([5])) is not None
    with pytest.raises(ValueError):
        PromptLookup(5, COSTS, min_ngram=3, max_ngram=2)


def test_the_lookup_is_preferred_only_while_it_pays():
    draft, lookup = AdaptiveWidth(4, COSTS), PromptLookup(4, COSTS)
    assert lookup.preferred_over(FixedWidth(4)), "a fixed-width draft cannot say: a match is taken"
    assert lookup.width == 8 and lookup.policy.widths == [1, 2, 4, 8], "a lookup block may be 2K wide"
    for policy, accepted in ((draft, 3), (lookup.policy, 0)):
        for width in policy.widths:
            policy.observe(width, [min(accepted, width - 1)] * 4)
    assert not lookup.preferred_over(draft), "a lookup that always misses must yield to a draft that hits"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["full-block", "adaptive"])
def test_greedy_output_with_lookups_is_the_targets(family, adaptive):
    target = tiny_target(family)
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=60, stop_token_ids=[])
    reference = [p + r.tokens for p, r in zip(PROMPTS, base)]
    for drafter in (tiny_draft(target, block_size=8), ScriptedDrafter(reference, 8)):
        # A draft that is right this often wins every choice against the lookup: the scripted one takes turns.
        if isinstance(drafter, ScriptedDrafter):
            guesses = own_proposer(target, drafter, make_policy(8, adaptive, COSTS), AlternatingLookup(8))
        else:
            guesses = proposer(target, drafter, adaptive=adaptive, lookup=True)
        spec = generate(target, guesses, PROMPTS, max_new_tokens=48, stop_token_ids=[])
        for b, s in zip(base, spec):
            assert s.tokens == b.tokens[:48], "a lookup block changed the target's greedy output"
        assert spec[0].stats.lookup_steps > 0, "the test must exercise lookup steps"
        assert spec[0].stats.lookup_steps < spec[0].stats.steps, "and drafted or plain steps beside them"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["k-nodes", "adaptive"])
def test_greedy_output_with_lookup_runs_grafted_onto_trees_is_the_targets(family, adaptive):
    """Each row's lookup continuation grafted onto the draft's tree (step.py): one verify for both, exact."""
    target = tiny_target(family)
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=60, stop_token_ids=[])
    for draft in (tiny_draft(target, block_size=8), None):
        lookup = PromptLookup(8, COSTS)
        drafter = draft or ScriptedDrafter([[0] * 80] * len(PROMPTS), 8)  # a draft that is always wrong
        guesses = own_proposer(target, drafter, make_policy(8, adaptive, COSTS, tree=True), lookup, tree=True)
        spec = generate(target, guesses, PROMPTS, max_new_tokens=48, stop_token_ids=[])
        for b, s in zip(base, spec):
            assert s.tokens == b.tokens[:48], "a grafted lookup run changed the target's greedy output"
        assert lookup.steps > 0 and float(lookup.policy.accepted.sum()) > 0, "grafted tokens must be accepted"


def missing_tree(costs):
    """A tree width policy (K = 4) that has seen every width accept nothing."""
    draft = make_policy(4, True, costs, tree=True)
    for width in draft.widths:
        draft.observe(width, [0], within={w: [0] for w in draft.widths if 1 < w <= width})
    return draft


def test_graft_length_follows_what_grafted_runs_are_worth():
    costs = linear_costs(plain=0.011, draft=0.0, per_position=0.001)  # 10 ms a step, 1 ms per verified position
    draft = missing_tree(costs)
    lookup = PromptLookup(4, costs)
    assert lookup.graft_length(FixedWidth(4), 4, 5) == 5, "a fixed-width draft policy cannot price it: the whole run"
    for _ in range(30):
        lookup.observe_graft(7, [7])
    assert lookup.graft_length(draft, 1, 7) == 7, "runs that always hit are grafted whole"
    for _ in range(100):  # the hits decay away
        lookup.observe_graft(7, [0])
    assert lookup.graft_length(draft, 1, 7) == 0, "runs that always miss are not"
    # But one is grafted again now and then: every explore_every-th step, or less often where that costs more
    # than the exploration budget. Here a whole run costs 7 ms on top of the 11 ms plain step, for a few
    # hundredths of a token more (the misses' decayed estimate): about 6 ms lost, at 2 % of the decode time one
    # in 6 / (0.02 * 11) ~ 28 steps.
    # In a batch the rows share the budget (policy.budgeted_interval): 4 rows re-graft a quarter as often.
    for budget, rows, expected in ((1.0, 1, (16, 16)), (0.02, 1, (25, 32)), (0.02, 4, (100, 128))):
        lookup.explore_budget, lookup.since_graft = budget, 0
        steps = next(n for n in range(1, 400)
                     if (lookup.observe_graft(0, []), lookup.graft_length(draft, 1, 7, rows=rows))[1])
        assert expected[0] <= steps <= expected[1], f"budget {budget}, {rows} rows: re-grafted after {steps} steps"


def test_a_re_try_that_cannot_win_is_asked_again_only_after_another_interval():
    # A whole run costs 50 ms a position on top of an 11 ms plain step: even 8 tokens a step would not beat a
    # plain step's 1 in 11 ms, so no re-try ever can win. Once one is due, the question (a loop over the slots'
    # confidence bounds) is asked once an interval, as the width policy asks, not at every step after.
    costs = linear_costs(plain=0.011, draft=0.0, per_position=0.05)
    draft = missing_tree(costs)
    lookup = PromptLookup(4, costs)
    for _ in range(100):
        lookup.observe_graft(7, [0])
    asked = []
    original = lookup.policy.optimistic_gain
    lookup.policy.optimistic_gain = lambda *args, **kwargs: asked.append(1) or original(*args, **kwargs)
    lookup.explore_budget = 1.0  # the interval is explore_every (16)
    steps = 320
    for _ in range(steps):
        lookup.observe_graft(0, [])
        assert lookup.graft_length(draft, 1, 7) == 0, "a re-try that cannot win must not run"
    assert 1 <= len(asked) <= steps // lookup.explore_every, f"asked {len(asked)} times in {steps} steps"


def test_a_graft_onto_a_plain_step_costs_no_draft_and_each_row_only_its_own_run():
    # Plain steps 11 ms; drafting costs 20 ms more; 1 ms per verified position of every row. Runs onto a plain step
    # make a ragged chain (step.py): no draft, and a row verifies its own run only. A run that gets 0.6 tokens
    # accepted pays alone (1.6 tokens in 12 ms against 1 in 11), and so in any batch, however few of its rows
    # hold a run: each row pays for its own positions only.
    costs = linear_costs(plain=0.011, draft=0.020, per_position=0.001)
    draft = missing_tree(costs)
    lookup = PromptLookup(4, costs)
    for _ in range(30):
        lookup.observe_graft(1, [1, 0, 1, 1, 0])
    for rows in (1, 2, 4, 8, 16):
        draft.at_batch(rows)
        assert lookup.graft_length(draft, 1, 1, rows=rows) == 1, f"{rows} rows"
        assert lookup.graft_length(draft, 1, 1, rows=rows, runs=[1] + [0] * (rows - 1)) == 1, f"{rows} rows"
    # At 11 ms a position the same run costs more than it brings, in a batch as alone.
    costs = linear_costs(plain=0.011, draft=0.020, per_position=0.011)
    draft, lookup = missing_tree(costs), PromptLookup(4, costs)
    for _ in range(30):
        lookup.observe_graft(1, [1, 0, 1, 1, 0])
    for rows in (1, 8):
        draft.at_batch(rows)
        assert lookup.graft_length(draft, 1, 1, rows=rows, runs=[1] * rows) == 0, f"{rows} rows"


def test_rows_without_a_run_are_not_counted_as_misses():
    costs = linear_costs(plain=0.011, draft=0.0, per_position=0.001)
    alone, ragged = PromptLookup(4, costs), PromptLookup(4, costs)
    for _ in range(20):
        alone.observe_graft(3, [3, 1])
        ragged.observe_graft(3, [3, 1, 0, 0], runs=[3, 3, 0, 0])  # two more rows had no run
    a, r = alone.policy.alpha(), ragged.policy.alpha()
    assert torch.allclose(a, r), f"rows without a run changed the lookup's acceptance: {a} vs {r}"
    miss = PromptLookup(4, costs)
    for _ in range(20):
        miss.observe_graft(3, [3, 1, 0, 0])  # the same steps counted as if every row had a full run
    assert miss.policy.alpha()[0] < a[0] - 0.2, "counting rows without a run as misses halves slot 1's rate"


def test_runs_are_looked_up_only_when_a_graft_may_pay():
    from types import SimpleNamespace

    from blockdraft.decode.proposers import TreeProposer
    from blockdraft.decode.state import DecodeState

    class Counting(PromptLookup):
        calls = 0

        def runs(self, tokens, lengths):
            self.calls += 1
            return super().runs(tokens, lengths)

    costs = linear_costs(plain=0.011, draft=0.0, per_position=0.001)
    draft = missing_tree(costs)
    state = DecodeState([[1, 2, 3, 1, 2]], 32, 8, {0}, torch.device("cpu"))
    lookup = Counting(4, costs)
    proposer = TreeProposer(SimpleNamespace(tap_layer_ids=(), block_size=4), draft, lookup)
    for _ in range(60):  # runs that always miss, of every strength
        lookup.observe_graft(7, [0])
        for policy in lookup.strength_policies:
            policy.record(8, [0])
    lookup.since_graft = 0
    assert proposer._graft_runs(state, 1) == (None, 0, 1) and lookup.calls == 0, "a graft that cannot pay"
    lookup.since_graft = 1000  # a re-try is due: the runs are looked up and grafted whole
    found, graft, width = proposer._graft_runs(state, 1)
    assert lookup.calls == 1 and found[0][0, :2].tolist() == [3, 1] and graft == int(found[1][0]) and width == 1


def test_lookup_steps_at_every_width_keep_greedy_exact():
    """Lookup and draft steps interleaved at widths cycling 1..K: the draft's deferred context stays right."""
    target = tiny_target("llama")
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=50, stop_token_ids=[])
    lookup = AlternatingLookup(8)
    guesses = own_proposer(target, tiny_draft(target, block_size=8), CyclingWidth(8), lookup)
    spec = generate(target, guesses, PROMPTS, max_new_tokens=40, stop_token_ids=[])
    for b, s in zip(base, spec):
        assert s.tokens == b.tokens[:40]
    assert lookup.steps > 0 and spec[0].stats.lookup_steps > 0
    drafted = [r.stats.steps - r.stats.plain_steps - r.stats.lookup_steps for r in spec]
    assert sum(drafted) > 0, "drafted steps must follow lookup steps for the draft's deferred context to matter"


# ------------------------------------------------------------------------------------- sampling with lookups

# Every token of the 6-token vocabulary occurs in the prompt: with min_ngram 1 every row always has a match.
LOOKUP_PROMPT = [3, 0, 4, 2, 5, 1, 3]


def lookup_counts(target, draft, params, num_rows: int, tree: bool = False) -> np.ndarray:
    V = target.config.vocab_size
    # The first step after the prefill is a lookup step; with trees, every step grafts its rows' whole runs.
    lookup = PromptLookup(4, COSTS, min_ngram=1) if tree else AlternatingLookup(4, policy=FixedWidth(4))
    policy = make_policy(4, False, tree=tree)  # the full block: K slots, or a tree of K nodes
    results = generate(target, own_proposer(target, draft, policy, lookup, tree=tree, block_size=4),
                       [LOOKUP_PROMPT] * num_rows, max_new_tokens=NUM_TOKENS, stop_token_ids=[],
                       selector=Selector(params, num_rows=num_rows))
    assert lookup.steps > 0, "the test must exercise lookup steps"
    return joint_counts(results, V)


@pytest.mark.parametrize("params", [dict(temperature=1.0, seed=90_000),
                                    dict(temperature=0.7, top_p=0.9, seed=100_000)], ids=["T1", "T0.7-topp0.9"])
def test_sampling_with_lookup_blocks_matches_target_distribution(small_models, params):
    target, draft = small_models
    sampling = SamplingParams(**params)
    counts = lookup_counts(target, draft, sampling, NUM_ROWS)
    pvalue = goodness_of_fit(counts, exact_joint(target, LOOKUP_PROMPT, sampling, NUM_TOKENS))
    assert pvalue > ALPHA, f"sampling with lookup blocks is not the target's distribution (p = {pvalue:.2e})"


def test_sampling_with_runs_grafted_onto_trees_matches_target_distribution(small_models):
    target, draft = small_models
    sampling = SamplingParams(temperature=1.0, seed=120_000)
    counts = lookup_counts(target, draft, sampling, NUM_ROWS, tree=True)
    pvalue = goodness_of_fit(counts, exact_joint(target, LOOKUP_PROMPT, sampling, NUM_TOKENS))
    assert pvalue > ALPHA, f"sampling over grafted trees is not the target's distribution (p = {pvalue:.2e})"


def test_grafted_trees_with_a_broken_tree_sampler_fail_the_same_test(small_models, monkeypatch):
    monkeypatch.setattr("blockdraft.decode.selection.tree_sample", final_draw_from_p)
    target, draft = small_models
    sampling = SamplingParams(temperature=1.0, seed=130_000)
    counts = lookup_counts(target, draft, sampling, 4000, tree=True)
    pvalue = goodness_of_fit(counts, exact_joint(target, LOOKUP_PROMPT, sampling, NUM_TOKENS))
    assert pvalue < ALPHA, f"a broken tree sampler passed the exactness test (p = {pvalue:.3f}); it has no power"


def test_a_lookup_block_with_the_wrong_q_fails_the_same_test(small_models, monkeypatch):
    """A looked-up token is a point mass; treating it as drawn from a uniform q accepts it too often."""
    def uniform_q(self, proposals, vocab_size):
        return proposals, torch.full((*proposals.shape, vocab_size), 1.0 / vocab_size)

    monkeypatch.setattr("blockdraft.decode.selection.Selector.point_mass", uniform_q)
    target, draft = small_models
    sampling = SamplingParams(temperature=1.0, seed=110_000)
    counts = lookup_counts(target, draft, sampling, 4000)
    pvalue = goodness_of_fit(counts, exact_joint(target, LOOKUP_PROMPT, sampling, NUM_TOKENS))
    assert pvalue < ALPHA, f"a wrong lookup q passed the exactness test (p = {pvalue:.3f}); it has no power"


def test_a_lookup_block_wider_than_k_is_exact_and_counted():
    """Lookup blocks reach 2K: tau past K lands in the overflow bin, and the bins stay K + 1."""
    target = tiny_target("llama")
    prompts = [[1, 5, 9, 13, 17], [3, 4], [7, 8, 9, 10, 11, 12, 13, 14, 15]]
    base = generate(target, TargetAlone(), prompts, max_new_tokens=80, stop_token_ids=[])
    spec = generate(target, proposer(target, tiny_draft(target, block_size=4), adaptive=True, lookup=True), prompts,
                    max_new_tokens=80, stop_token_ids=[])
    assert [s.tokens for s in spec] == [b.tokens for b in base]
    pooled = spec[0].stats.merge(spec[1].stats).merge(spec[2].stats)
    assert pooled.block_size == 4 and len(pooled.histogram) == 5 and pooled.histogram[4] > 0, pooled.histogram
    within = sum((i + 1) * n for i, n in enumerate(pooled.histogram[:4]))
    assert pooled.tokens > within + 4 * pooled.histogram[4], "each overflow step commits more than K tokens"


def test_graft_lengths_kept_between_steps_equal_lengths_computed_afresh():
    """graft_length keeps its choice until either policy's counts change; one that decides afresh at every step
    must graft the same lengths through hits, misses, re-tries and batch-size changes."""
    costs = linear_costs(plain=0.011, draft=0.004, per_position=0.001)
    draft = make_policy(4, True, costs, tree=True)
    kept, fresh = PromptLookup(4, costs), PromptLookup(4, costs)
    generator = torch.Generator().manual_seed(3)
    chosen = []
    for step in range(400):
        rows = 1 + (step // 70) % 2
        draft.at_batch(rows)
        width = draft.choose()
        available = int(torch.randint(0, 8, (1,), generator=generator))
        graft = kept.graft_length(draft, width, available, rows=rows)
        fresh._planned.clear()
        assert fresh.graft_length(draft, width, available, rows=rows) == graft, f"step {step}"
        chosen.append(graft)
        hits = step % 100 < 50  # runs hit for a while, then miss
        accepted = [int(torch.randint(0, graft + 1, (1,), generator=generator)) if hits else 0 for _ in range(rows)]
        for lookup in (kept, fresh):
            lookup.observe_graft(graft, accepted if graft else [])
        if width > 1:
            draft.observe(width, [0] * rows, within={w: [0] * rows for w in draft.widths if 1 < w <= width})
        else:
            draft.observe(1, [0] * rows)
    assert len(set(chosen)) > 2 and 0 in chosen


@pytest.mark.parametrize("tree", [True, False], ids=["trees", "chains"])
def test_lookup_alone_never_runs_the_draft_and_keeps_the_targets_output(tree, monkeypatch):
    """`drafting=False` (the bench's blockdraft-lookup-only): looked-up runs on plain steps, the draft never run."""
    from blockdraft.decode.decoder import Decoder
    from blockdraft.decode.drafter import Drafter
    from blockdraft.decode.options import DecodeOptions

    target = tiny_target("llama")
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=48, stop_token_ids=[])
    for name in ("propose", "propose_top", "append_context"):
        monkeypatch.setattr(Drafter, name, lambda *a, **k: pytest.fail("the draft ran"))
    decoder = Decoder(target, tiny_draft(target, block_size=8), DecodeOptions(tree=tree, drafting=False),
                      costs=COSTS)
    assert decoder.proposer(len(PROMPTS)).tap_layer_ids == (), "no step taps features for a draft that never runs"
    results = decoder.generate(PROMPTS, max_new_tokens=48, stop_token_ids=[])
    assert [r.tokens for r in results] == [b.tokens for b in base], "lookup alone changed the target's output"
    stats = results[0].stats
    assert stats.lookup_steps > 0, "the prompts must give lookup runs"
    assert stats.plain_steps + stats.lookup_steps == stats.steps, "every step plain or a lookup run"


def test_lookup_alone_needs_lookup():
    from blockdraft.decode.options import PRESETS, DecodeOptions
    from blockdraft.errors import InputError

    with pytest.raises(InputError, match="drafting=False"):
        DecodeOptions(drafting=False, lookup=False)
    with pytest.raises(InputError, match="`drafting` must be True or False"):
        DecodeOptions(drafting="no")
    assert PRESETS["lookup-only"].describe() == "lookup alone"
