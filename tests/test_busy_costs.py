"""Step costs timed on a busy machine (decode/cpu_wait.py, decode/measure.py): each bucket keeps how long our threads
waited for a CPU while it was timed, and a bucket timed busy is measured again at the first start on a quiet
machine."""

from __future__ import annotations

import pytest

from blockdraft.decode.costs import CostModel, linear_costs
from blockdraft.decode.measure import measured_costs

from step_fakes import cached_for_a_tiny_target, fixed_watch


def _shared_machine(phase: dict):
    """timed_kinds and WaitWatch for measure.py on a fake 2-core machine that another job shares while
    `phase["busy"]`: waiting for a CPU adds 30 ms to every step (a q4 plain step of 10 ms then looks like 40, and a
    drafted step of 8 nodes like 1.4 plain steps instead of 2.6), and our threads wait 60 % of the time."""
    def quiet(kind):
        name, n = kind
        if name == "extra":
            return 0.010 + 0.0005 * n
        return 0.010 if n == 1 else 0.016 + 0.0015 * (n - 1)  # the draft's 6 ms, then 1.5 ms a position

    def timed_kinds(target, drafter, tree, rows, kinds, cycles):
        return {kind: [quiet(kind) + (0.030 if phase["busy"] else 0.0)] * cycles for kind in kinds}

    watch = fixed_watch(lambda: 0.6 if phase["busy"] else 0.0)
    return timed_kinds, watch, {w: quiet(("width", w)) / quiet(("width", 1)) for w in (2, 4, 8)}


def _drafts_at_tau_one_and_a_half(model) -> bool:
    """Whether the width policy drafts for a draft whose first guess is right half the time and whose second never
    is (tau 1.5 at any width): it pays where a drafted step costs under 1.5 plain steps."""
    from blockdraft.decode.policy import AdaptiveWidth

    policy = AdaptiveWidth(8, model)
    for step in range(60):
        policy.observe(8, [step % 2])
    return max(policy.widths, key=policy.rate) > 1


@pytest.mark.measured_costs
def test_costs_measured_under_load_are_measured_again_on_the_quiet_machine(tmp_path, monkeypatch):
    """Costs first measured while another job held the cores, then used on the quiet machine, once made the
    default mode 0.90x the target alone (a q4 cache that priced drafting cheap, so the policy drafted at a tau that
    loses); no statistic of the step times tells such a machine from a slower one. The share of the timing our
    threads waited for a CPU does: the cache keeps it, a start on a busy machine keeps the cache (the same request
    keeps its text), and the first start on a quiet one measures those costs again."""
    import blockdraft.decode.costs as costs
    import blockdraft.decode.measure as measure

    phase = {"busy": True}
    timed_kinds, Watch, quiet_break_evens = _shared_machine(phase)
    monkeypatch.setattr(measure, "timed_kinds", timed_kinds)
    monkeypatch.setattr(measure, "WaitWatch", Watch)
    monkeypatch.setattr(costs, "WaitWatch", Watch)
    target, drafter = cached_for_a_tiny_target(tmp_path, monkeypatch, None)  # no cache yet: a first start

    # 1. The first start runs beside the other job: measured, kept for the run and cached, and named.
    with pytest.warns(UserWarning, match="waited 60% of the time for a CPU.*measured again at the next start"):
        busy = measured_costs(target, drafter, True, rows=1)
    assert busy.busy_buckets() == {1} and busy.waited == {1: 0.6}
    assert busy.break_even(1, 8) < 1.5 < quiet_break_evens[8], "the load bends the prices toward a plain step's"
    assert _drafts_at_tau_one_and_a_half(busy), "so a draft that loses on the quiet machine looks worth running"

    # 2. A start while the job still runs keeps the cache: a timing taken now would be bent too.
    monkeypatch.setattr(measure, "_COSTS", {})
    with pytest.warns(UserWarning, match="busy now too"):
        assert measured_costs(target, drafter, True, rows=1) == busy

    # 3. The first start on the quiet machine measures them again and replaces the cache.
    phase["busy"] = False
    monkeypatch.setattr(measure, "_COSTS", {})
    with pytest.warns(UserWarning, match="quiet now: measuring them again"):
        quiet = measured_costs(target, drafter, True, rows=1)
    assert quiet.busy_buckets() == set() and quiet.waited == {1: 0.0}
    assert [quiet.break_even(1, w) for w in (2, 4, 8)] == [pytest.approx(quiet_break_evens[w]) for w in (2, 4, 8)]
    assert not _drafts_at_tau_one_and_a_half(quiet), "a draft at tau 1.5 loses against a 10 ms plain step"

    # 4. From then on every start reads the quiet cache, as any cache: the same request keeps its text.
    monkeypatch.setattr(measure, "_COSTS", {})
    monkeypatch.setattr(measure, "measure_costs", lambda *args: pytest.fail("a quiet cache was measured again"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measured_costs(target, drafter, True, rows=1) == quiet


def test_a_cost_model_keeps_what_its_measurement_waited():
    model = linear_costs(plain=0.02, draft=0.01, per_position=0.001, buckets=(1, 2, 4))
    model.waited = {1: 0.02, 2: 0.45}  # 4: measured where the kernel does not say
    assert model.busy_buckets() == {2}, "only a bucket whose threads waited a tenth of the time or more"
    assert CostModel.from_json(model.to_json()) == model, "the disk cache keeps it"
    assert CostModel.from_json({"plain": {"1": 0.1}, "drafted": {"1": {"2": 0.2}}}).waited == {}, \
        "a cache written before it was kept reads as not known"
    rest = model.without({2})
    assert rest.buckets() == {1, 4} and rest.waited == {1: 0.02}
    model.update(linear_costs(plain=0.02, draft=0.01, per_position=0.001, buckets=(2,)))
    assert model.busy_buckets() == set(), "a bucket measured again forgets its last measurement's wait"
