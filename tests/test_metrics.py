"""AcceptanceStats (blockdraft/metrics.py): the tau convention, the histogram's fixed bins, merging."""

from __future__ import annotations

import pytest

from blockdraft.decode.generate import generate

from blockdraft.decode.proposers import TargetAlone
from blockdraft.metrics import AcceptanceStats, tau_bins
from step_fakes import ScriptedDrafter, proposer
from tiny_models import tiny_draft, tiny_target


def test_tau_bins_are_one_to_k_then_an_overflow_bin():
    assert tau_bins(4) == ["1", "2", "3", "4", ">4"]
    assert tau_bins(1) == ["1", ">1"], "the target alone (K=1) still has its overflow bin"


def test_the_bins_are_k_plus_one_however_wide_the_steps():
    """A tree of 2K nodes or a lookup block of 12 tokens must not change the bins: rows of one run would print
    histograms of different lengths, and the header's K would not be the K the user set."""
    stats = AcceptanceStats(8)
    stats.record(3, 16)  # a tree of 2K nodes that committed 3 tokens
    stats.record(12, 12, lookup=True)  # a lookup block that committed 12 tokens
    stats.record(8)  # the full block, all accepted
    assert stats.block_size == 8, "K is the block size asked for, never the widest step"
    assert len(stats.histogram) == 9 and stats.histogram[2] == 1 and stats.histogram[7] == 1, stats.histogram
    assert stats.histogram[8] == 1, "a step committing more than K tokens belongs in the overflow bin"
    assert stats.tokens == 3 + 12 + 8 and stats.mean_tau == pytest.approx(23 / 3), "tau still counts every token"
    assert len(stats.per_position_acceptance()) == 7, "per-position rates cover the draft's slots 1..K-1"
    assert stats.histogram_text().endswith("8:1 >8:1"), stats.histogram_text()
    assert stats.as_dict()["tau_bins"] == tau_bins(8)


def test_merged_stats_keep_the_shape_and_refuse_another_k():
    a, b = AcceptanceStats(4), AcceptanceStats(4)
    a.record(2)
    b.record(7, 8, lookup=True)
    merged = a.merge(b)
    assert merged.block_size == 4 and merged.histogram == [0, 1, 0, 0, 1], merged.histogram
    with pytest.raises(ValueError, match="K=8"):
        a.merge(AcceptanceStats(8))  # adding 9 bins to 5 would mislabel every count


def test_every_row_and_mode_of_one_k_has_the_same_bins():
    """Chains, trees of up to 2K nodes and lookup blocks up to 2K wide: the same K in, the same bins out."""
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4)
    prompts = [[1, 5, 9, 13, 17, 1, 5, 9], [3, 4], [7, 8, 9, 10, 11, 12, 13, 14, 15]]
    for mode in (dict(), dict(tree=True), dict(tree=True, adaptive=True, lookup=True), dict(lookup=True)):
        results = generate(target, proposer(target, draft, block_size=4, **mode), prompts, max_new_tokens=40,
                           stop_token_ids=[])
        shapes = {(r.stats.block_size, len(r.stats.histogram), len(r.stats.slot_reached)) for r in results}
        assert shapes == {(4, 5, 3)}, f"{mode}: rows of one K must share one shape, got {shapes}"


class PerfectDrafter(ScriptedDrafter):
    """Right at every slot: each step commits the full K tokens, so a budget or a stop can cut one mid-block."""

    def propose(self, *args, **kwargs):
        self.calls = self.block_size - 1  # ScriptedDrafter is right for the first calls % K slots
        return super().propose(*args, **kwargs)


def test_a_cut_step_counts_only_its_returned_tokens():
    stats = AcceptanceStats(4)
    stats.record(2, 4, committed=4)  # the step accepted all 3 proposals; the budget kept 2 tokens
    assert stats.histogram == [0, 1, 0, 0, 0] and stats.tokens == 2, "tau counts the returned tokens only"
    assert stats.slot_reached == [1, 1, 0] and stats.slot_accepted == [1, 1, 0], (
        "slot 2's token was returned and accepted: the cut after it is no rejection")


@pytest.mark.parametrize("cut", ["budget", "stop"])
def test_mean_tau_is_returned_tokens_over_steps(cut):
    """A last step cut by the budget (or a stop token) must count only the tokens the caller got, as the reference
    runtime and transformers count them: tau = returned new tokens, less the prefill's, over steps."""
    target = tiny_target("llama")
    prompt = [3, 4]
    base = generate(target, TargetAlone(), [prompt], max_new_tokens=12, stop_token_ids=[])[0].tokens
    stop = []
    if cut == "stop":  # the first token not seen before it, past the first full step
        stop = [next(t for i, t in enumerate(base) if i >= 6 and t not in base[:i])]  # cuts the second step
    out = generate(target, proposer(target, PerfectDrafter([prompt + base], 4), block_size=4), [prompt],
                   max_new_tokens=6 if cut == "budget" else 12, stop_token_ids=stop)[0]
    stats = out.stats
    assert stats.tokens == len(out.tokens) - 1 == stats.new_tokens - 1, (
        f"tau must count the {len(out.tokens) - 1} returned tokens after the prefill's, got {stats.tokens}")
    assert stats.mean_tau == pytest.approx((len(out.tokens) - 1) / stats.steps)
    assert out.finish_reason == ("length" if cut == "budget" else "stop")
    assert stats.steps == 2 and stats.histogram[3] == 1 and stats.histogram[4] == 0, (
        f"one full step of 4, then a step cut short: {stats.histogram}")
