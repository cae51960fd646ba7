"""The step-cost model (decode/costs.py): interpolation, nearest buckets, measurement once per process, the disk
cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from blockdraft.decode.costs import CostModel, batch_bucket, linear_costs, read_cached, write_cached
from blockdraft.decode.drafter import Drafter
from blockdraft.decode.measure import measured_costs

from step_fakes import cached_for_a_tiny_target
from tiny_models import tiny_draft, tiny_target


def test_costs_interpolate_between_measured_widths_and_borrow_the_nearest_bucket():
    model = CostModel({1: 1.0, 8: 3.0}, {1: {2: 1.5, 4: 1.7, 8: 2.1}, 8: {2: 4.0, 8: 7.0}})
    assert model.seconds(1, 3, drafted=True) == pytest.approx(1.6), "between 2 and 4: on their line"
    assert model.seconds(1, 16, drafted=True) == pytest.approx(2.9), "past the widest: the last segment's slope"
    assert model.per_position(1) == pytest.approx(0.1) and model.seconds(1, 5, drafted=False) == pytest.approx(1.4)
    assert model.seconds(2, 2, drafted=True) == 1.5 and model.seconds(5, 2, drafted=True) == 4.0, \
        "an unmeasured bucket borrows the nearest measured one (the smaller on a tie)"
    assert [batch_bucket(r) for r in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    with pytest.raises(ValueError, match="no measurements"):
        CostModel().seconds(1, 2, drafted=True)


def test_ragged_steps_are_priced_from_their_own_measurements():
    # Measured as an int4 target's blocks make them: 1-4 more positions cost alike, 5-8 a block more.
    model = CostModel({8: 13.0}, {8: {2: 26.0, 16: 124.0}}, {8: {1: 17.0, 4: 17.0, 8: 21.0}})
    assert model.ragged_seconds(8, 0) == 13.0 and model.ragged_seconds(8, 4) == 17.0
    assert model.ragged_seconds(8, 6) == pytest.approx(19.0), "between 4 and 8: on their line"
    assert model.ragged_seconds(8, 12) == pytest.approx(25.0), "past the last: its slope"
    longer = CostModel({8: 13.0}, {8: {2: 26.0}}, {8: {0: 15.0, 4: 19.0}})  # timed over a longer context
    assert longer.ragged_seconds(8, 0) == 15.0 and longer.ragged_seconds(8, 2) == pytest.approx(17.0), \
        "a table with its own plain step is read from it, not from the shorter context's"
    unmeasured = CostModel({8: 13.0}, {8: {2: 26.0, 16: 124.0}})
    assert unmeasured.ragged_seconds(8, 4) == pytest.approx(13.0 + 4 * 7.0 / 8), "else per_position / rows each"
    assert CostModel.from_json(model.to_json()) == model


def test_a_cost_model_survives_the_disk_cache(tmp_path):
    model = linear_costs(plain=0.02, draft=0.01, per_position=0.001, buckets=(1, 4))
    write_cached(tmp_path, "key", model)
    assert read_cached(tmp_path, "key") == model
    (tmp_path / "bad.json").write_text("{not json")
    assert read_cached(tmp_path, "bad") is None and read_cached(tmp_path, "missing") is None, "measured again"


@pytest.mark.measured_costs
def test_costs_are_measured_once_per_process_and_cached_on_disk(tmp_path, monkeypatch):
    import blockdraft.decode.measure as generate

    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(generate, "_COSTS", {})
    target = tiny_target("llama")
    target.name = "tiny-test-target"  # a named target's costs go to the disk cache
    drafter = Drafter(tiny_draft(target, block_size=4), target)
    model = measured_costs(target, drafter, True, rows=3)
    assert model.buckets() == {1, 2, 4}, "every bucket up to 3 rows"
    assert set(model.drafted[1]) == {2, 3, 4, 5, 8}, "the candidates of trees of up to 2K nodes, and where costs bend"
    assert set(model.ragged[1]) == {0, 1, 2, 3, 4, 8} and set(model.ragged[2]) == {0, 1, 2, 3, 4, 8, 16}, "15 a row"
    assert all(seconds > 0 for seconds in model.plain.values())
    assert measured_costs(target, drafter, True, rows=2) is model, "measured once per process"
    monkeypatch.setattr(generate, "_COSTS", {})
    monkeypatch.setattr(generate, "measure_costs", lambda *args: pytest.fail("the disk cache was not read"))
    assert measured_costs(target, drafter, True, rows=3) == model, "a new process reads the same model back"


def test_the_cost_key_follows_the_code_a_step_runs(tmp_path):
    """An edit of the model, decode or sampling code (or an upgrade) gives tables of its own; other code does not."""
    import shutil

    from blockdraft.decode.cost_key import STEP_CODE, code_digest

    package = Path(__import__("blockdraft").__file__).parent
    for folder in (*STEP_CODE, "commands"):
        shutil.copytree(package / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(package / "cache.py", tmp_path / "cache.py")
    before = code_digest(tmp_path)
    assert code_digest(tmp_path) == before, "the same code, the same digest"
    (tmp_path / "commands" / "generate.py").write_text("# another front end\n")
    assert code_digest(tmp_path) == before, "code outside a step keeps the tables"
    for edited in ("decode/step.py", "model/target.py", "sampling/accept.py", "cache.py"):
        path = tmp_path / edited
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        assert code_digest(tmp_path) != before, f"an edit of {edited} must time the steps again"
        path.write_bytes(original)
    (tmp_path / "decode" / "extra.py").write_text("X = 1\n")
    assert code_digest(tmp_path) != before, "a new module of a step's package counts"


@pytest.mark.measured_costs
@pytest.mark.filterwarnings("ignore:the cached step costs")  # the stale cache is the point here
def test_fresh_costs_replace_the_cached_ones_once_per_process(tmp_path, monkeypatch):
    import blockdraft.decode.measure as generate
    from blockdraft.decode.cost_key import cost_key

    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(generate, "_COSTS", {})
    monkeypatch.setattr(generate, "_REMEASURED", set())
    target = tiny_target("llama")
    target.name = "tiny-test-target"
    drafter = Drafter(tiny_draft(target, block_size=4), target)
    stale = linear_costs(plain=9.0, draft=9.0, per_position=9.0, buckets=(1,))  # measured on a busy machine
    write_cached(tmp_path / "costs", cost_key(target, drafter.config, 4, True, None), stale)
    assert measured_costs(target, drafter, True, rows=1) == stale, "the cached model is read"
    monkeypatch.setattr(generate, "_COSTS", {})
    fresh = measured_costs(target, drafter, True, rows=1, fresh=True)
    assert fresh != stale and fresh.plain[1] < 9.0, "measured again, not read"
    assert measured_costs(target, drafter, True, rows=1, fresh=True) is fresh, "once per process"
    monkeypatch.setattr(generate, "_COSTS", {})
    assert measured_costs(target, drafter, True, rows=1) == fresh, "and it replaced the cached one"


def _machine(quiet: dict[tuple, float], factor):
    """time_kinds for measure_costs on a fake machine: the i-th step timed (kinds in turn, cycle after cycle, rounds
    one after another) takes its kind's quiet seconds times factor(i, kind)."""
    taken = [0]

    def time_kinds(rows, kinds, cycles):
        out = {kind: [] for kind in kinds}
        for _ in range(cycles):
            for kind in kinds:
                out[kind].append(quiet[kind] * factor(taken[0], kind))
                taken[0] += 1
        return out

    return time_kinds


QUIET = {("width", 1): 0.010, ("width", 2): 0.017, ("width", 4): 0.020, ("width", 8): 0.026}


def _break_evens(model) -> list[float]:
    return [model.break_even(1, w) for w in (2, 4, 8)]


def _quiet_break_evens() -> list[float]:
    return [pytest.approx(QUIET["width", w] / QUIET["width", 1]) for w in (2, 4, 8)]


def test_a_busy_first_measurement_prices_every_width_as_the_quiet_machine_would():
    """Another job takes the core on 60 % of steps and makes them 3x slower (a load of 4-6 on 2 cores). A median
    of each width's own steps once priced some widths at their slow spells, and the cache then made the default
    mode 0.94x the target alone on the quiet machine. Each kind's cost in plain steps is taken within a cycle: a
    pair of steps that both met the job, or neither, tells the quiet ratio, and most do."""
    import random

    from blockdraft.decode import costs

    draw = random.Random(0)
    model = costs.measure_costs(_machine(QUIET, lambda i, kind: 3.0 if draw.random() < 0.6 else 1.0),
                                [1, 2, 4, 8], [1], ragged=False)
    assert model.plain[1] == QUIET["width", 1], "the plain step is priced at its quiet cost"
    assert _break_evens(model) == _quiet_break_evens(), \
        "a slow spell of the machine priced a width: the policy would then weigh widths wrongly on a quiet machine"


@pytest.mark.parametrize("speed", [0.7, 1.8])
def test_a_spell_of_a_faster_or_slower_machine_changes_no_width_s_cost_in_plain_steps(speed):
    """A 2-core VM ran plain steps at 13 ms for a second and 19-20 ms around it: timed in blocks of their own, the
    widths that met such a spell were priced apart from those that did not. Timed in turn, all meet it alike."""
    from blockdraft.decode import costs

    spell = range(40, 140)  # steps, over several cycles of every kind
    model = costs.measure_costs(_machine(QUIET, lambda i, kind: speed if i in spell else 1.0), [1, 2, 4, 8], [1],
                                ragged=False)
    assert _break_evens(model) == _quiet_break_evens()


def test_a_lucky_fast_step_prices_no_width():
    """On a quiet machine one step of a kind now and then runs a third faster than the rest (a q4 drafted step of 2
    nodes: 24-25 ms among 33-37, Ice Lake). Priced by its fastest step, a drafted width was priced under what
    decodes paid, so speculation looked cheaper than it is: here 1.20 plain steps for 1.70."""
    from blockdraft.decode import costs

    lucky = {("width", 2): 0.70, ("width", 1): 0.99}
    time_kinds = _machine(QUIET, lambda i, kind: lucky.get(kind, 1.0) if i in (24, 25) else 1.0)
    model = costs.measure_costs(time_kinds, [1, 2, 4, 8], [1], ragged=False)
    assert _break_evens(model) == _quiet_break_evens()
    # the fastest step of each kind, the statistic the costs were once taken with, misprices it
    times = _machine(QUIET, lambda i, kind: lucky.get(kind, 1.0) if i in (24, 25) else 1.0)(1, list(QUIET), 15)
    fastest = {kind: min(seconds) for kind, seconds in times.items()}
    assert fastest["width", 2] / fastest["width", 1] == pytest.approx(0.017 * 0.7 / 0.0099)


def test_a_cache_from_a_busier_machine_is_named_and_kept():
    from blockdraft.decode.costs import stale_cache_note

    assert stale_cache_note(0.030, [0.011, 0.010, 0.012]) is not None, "cached 3x slower than now: say so"
    assert stale_cache_note(0.012, [0.010, 0.030]) is None, "within the ratio: nothing to say"
    assert stale_cache_note(0.010, [0.030]) is None, "a busy machine now does not make the cache wrong"


@pytest.mark.measured_costs
def test_a_stale_cache_warns_at_load_and_still_decides(tmp_path, monkeypatch):
    stale = linear_costs(plain=9.0, draft=9.0, per_position=9.0, buckets=(1,))  # measured on a busy machine
    target, drafter = cached_for_a_tiny_target(tmp_path, monkeypatch, stale)
    with pytest.warns(UserWarning, match="busier machine"):
        assert measured_costs(target, drafter, True, rows=1) == stale, \
            "a cache is never replaced on a timing: the same request keeps its text"


@pytest.mark.measured_costs
def test_a_cache_that_prices_only_a_batch_wrong_is_named(tmp_path, monkeypatch):
    # Measured while other jobs ran: one row priced right (here: faster than any step now), 2 rows 9 s a step.
    from blockdraft.decode.costs import CostModel

    widths = {2: 1e-6, 4: 1e-6, 8: 1e-6}
    cached = CostModel({1: 1e-6, 2: 9.0}, {1: dict(widths), 2: dict(widths)})
    target, drafter = cached_for_a_tiny_target(tmp_path, monkeypatch, cached)
    # Read for one row (as a warming server reads it), the cache still prices later 2-row batches: it is probed.
    with pytest.warns(UserWarning, match="a plain step of 2 rows at 9000.0 ms"):
        assert measured_costs(target, drafter, True, rows=1).buckets() == {1, 2}, "the whole cache is read"
    assert measured_costs(target, drafter, True, rows=2) == cached, "warned, and still the cache decides"


def test_a_draft_scoring_other_ids_does_not_read_anothers_costs(tmp_path, monkeypatch):
    """The draft's head is a large part of its step, so its proposal vocabulary's size keys the cache: a draft
    served with a smaller vocabulary (or with every id, `--full-vocab`) is timed for itself."""
    import torch

    import blockdraft.decode.measure as generate
    from blockdraft.decode.cost_key import cost_key
    from blockdraft.io.drafts import LoadedDraft

    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(generate, "_COSTS", {})
    target = tiny_target("llama")
    target.name = "tiny-test-target"
    draft = tiny_draft(target, block_size=4)
    full = Drafter(draft, target)
    limited = Drafter(LoadedDraft(draft, vocab=torch.arange(1, 40)), target)
    keys = {cost_key(target, full.config, 4, True, n) for n in (None, 39, 20)}
    assert len(keys) == 3
    slow = linear_costs(plain=9.0, draft=9.0, per_position=9.0, buckets=(1,))
    write_cached(tmp_path / "costs", cost_key(target, full.config, 4, True, None), slow)
    with pytest.warns(UserWarning, match="cached step costs"):  # 9 s a step: far slower than now, as meant
        assert measured_costs(target, full, True, rows=1) == slow, "the full-vocabulary draft reads its own costs"
    assert measured_costs(target, limited, True, rows=1) != slow, "the limited one is measured for itself"


def test_a_drafted_width_timed_under_a_plain_step_is_timed_again_and_never_priced_below_it():
    """A cache once priced a q4 plain step at 22.0 ms and a drafted step of width 2 at 17.1 (a slow spell met every
    plain step); the policy then drafted where it lost (0.85x the target alone). Timed again while a drafted step
    still looks cheaper than a plain one, a bounded number of rounds, then floored: a drafted step costs a plain
    step's verify plus the draft."""
    from blockdraft.decode import costs

    rounds = []

    def time_kinds(rows, kinds, cycles):
        rounds.append(1)
        slow = len(rounds) <= slow_rounds  # every plain step of the first rounds met a slow spell
        return {kind: [QUIET[kind] * (3.0 if slow and kind == ("width", 1) else 1.0)] * cycles for kind in kinds}

    slow_rounds = 1  # outvoted by the other rounds' cycles
    model = costs.measure_costs(time_kinds, [1, 2, 4, 8], [1], ragged=False)
    assert len(rounds) == costs.ROUNDS and _break_evens(model) == _quiet_break_evens()
    slow_rounds, rounds = 100, []  # slow for every round there is
    model = costs.measure_costs(time_kinds, [1, 2, 4, 8], [1], ragged=False)
    assert len(rounds) == costs.ROUNDS + costs.EXTRA_ROUNDS, "timed again, a bounded number of rounds"
    assert all(t >= model.plain[1] for t in model.drafted[1].values()), "a drafted width priced below a plain step"


@pytest.mark.measured_costs
@pytest.mark.parametrize("tree", [True, False])
def test_every_kind_is_timed_in_turn_in_one_decode(tree):
    from blockdraft.decode import measure

    target = tiny_target("llama")
    drafter = Drafter(tiny_draft(target, block_size=4), target)
    kinds = [("width", 1), ("width", 2), ("width", 4), ("extra", 1), ("extra", 16)]
    taken = []
    watch_class = measure.CycleWatch

    class Watching(watch_class):
        def propose(self, state, selector):
            proposal = super().propose(state, selector)
            taken.append((self.taken[-1], proposal.drafted, int(proposal.tokens.shape[1]),
                          None if proposal.widths is None else proposal.widths.tolist()))
            return proposal

    measure.CycleWatch = Watching
    try:
        times = measure.timed_kinds(target, drafter, tree, 2, kinds, 3)
    finally:
        measure.CycleWatch = watch_class
    assert {kind: len(seconds) for kind, seconds in times.items()} == {kind: 3 for kind in kinds}
    assert all(s > 0 for seconds in times.values() for s in seconds)
    assert [t[0] for t in taken[: 3 * len(kinds)]] == kinds * 3, "the kinds in turn, cycle after cycle"
    by_kind = {t[0]: t[1:] for t in taken}
    assert by_kind["width", 1] == (False, 1, None) and by_kind["width", 4][:2] == (True, 4)
    assert by_kind["extra", 1] == (False, 2, [2, 1]), "one extra guess: the first row's"
    assert by_kind["extra", 16] == (False, 16, [16, 2]), "15 a row from the first"



def test_tables_timed_with_onednns_bf16_products_are_not_read_where_aten_runs_them(monkeypatch):
    """Where bf16 is emulated the target's bf16 products run ATen's kernel (kernels.aten_bf16_products), whose
    many-row head costs otherwise: a bf16 target's key says so there, and only there; so does a greedy screen."""
    import torch

    from blockdraft.decode import cost_key as costs
    from blockdraft.model import kernels
    from blockdraft.model.target import Target

    target = Target(tiny_target("llama").model.to(torch.bfloat16))
    target.name = "tiny-test-target"
    target._screen = None  # this machine's CPU may give it one: the screen is asked about below
    config = tiny_draft(target, block_size=4).config
    keys = {}
    for native in (True, False):
        paths = kernels.CpuPaths("test", True, native_bf16=native, packed_bf16=False, int4=True)
        monkeypatch.setattr(costs, "cpu_paths", lambda paths=paths: paths)
        keys[native] = cost_key_of(costs, target, config)
    assert keys[True] != keys[False]
    target._screen = object()  # greedy verify blocks through the int8 screen
    assert cost_key_of(costs, target, config) != keys[False], "a screened target's tables are its own"
    target32 = tiny_target("llama")
    target32.name = "tiny-test-target"
    monkeypatch.setattr(costs, "cpu_paths", lambda: kernels.CpuPaths("t", True, False, False, True))
    emulated = cost_key_of(costs, target32, config)
    monkeypatch.setattr(costs, "cpu_paths", lambda: kernels.CpuPaths("t", True, True, True, True))
    assert cost_key_of(costs, target32, config) == emulated, "float32 keeps its tables"
    monkeypatch.setattr(costs, "step_code_digest", lambda: "edited")
    assert cost_key_of(costs, target32, config) != emulated, "the code a step runs is part of the key"


def cost_key_of(costs, target, config) -> str:
    return costs.cost_key(target, config, 4, True, None)
