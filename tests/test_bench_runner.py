"""The bench's runner (bench/runner.py): fair interleaving, rounds, equal truncation.

No timing is asserted: only how runs are scheduled and rows counted (a scripted clock where times matter).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from blockdraft.bench import BenchSettings
from blockdraft.bench.methods import Decoded
from blockdraft.bench.runner import batches, interleaved_order, run_bench, trim

STOP = 2  # the tiny targets' eos id


def test_interleaved_order_puts_every_method_in_every_slot():
    names = ["a", "b", "c", "d"]
    orders = [interleaved_order(names, i) for i in range(8)]
    assert orders[0] == names, "the first batch runs the methods in their base order"
    assert orders[1] == ["b", "c", "d", "a"], "each batch rotates the order left by one"
    for slot in range(len(names)):
        assert {o[slot] for o in orders[:4]} == set(names), "over M batches every method must run in every slot"
    assert orders[4] == orders[0], "the rotation has period M"


def test_batches_keep_file_order():
    assert batches(5, 2) == [[0, 1], [2, 3], [4]]
    assert batches(3, 1) == [[0], [1], [2]]


def test_trim_counts_through_first_stop_and_caps_length():
    assert trim([5, 6, STOP, 0, 0], {STOP}, 10) == [5, 6, STOP], "pads after a stop must not count as new tokens"
    assert trim([5, 6, 7, 8], {STOP}, 3) == [5, 6, 7], "no method may be credited past max_new_tokens"
    assert trim([5, 6, 7, STOP], {STOP}, 3) == [5, 6, 7]


class FakeMethod:
    """Returns each prompt followed by a stop and padding, and logs every call."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def decode(self, prompts, max_new_tokens):
        self.log.append((self.name, max_new_tokens, len(prompts)))
        return [Decoded(list(p) + [STOP, 0, 0]) for p in prompts]


def test_runner_warms_up_then_interleaves_and_truncates():
    log = []
    methods = [FakeMethod(n, log) for n in ("a", "b", "c")]
    prompts = [[10, 11], [12], [13, 14], [15]]
    # All the runner asks of a target: its context, device and vocabulary (the prompts' ids are checked).
    target = SimpleNamespace(max_positions=512, device=torch.device("cpu"), config=SimpleNamespace(vocab_size=64))
    run = run_bench(target, methods, prompts, BenchSettings(block_size=4, max_new_tokens=32, batch_size=1),
                    [STOP])
    warm, timed = log[:3], log[3:]
    assert [name for name, _, _ in warm] == ["a", "b", "c"] and all(n == 16 for _, n, _ in warm)
    assert [name for name, _, _ in timed] == list("abc" "bca" "cab" "abc"), "methods must rotate per prompt"
    assert [r["method"] for r in run.rows] == [name for name, _, _ in timed]
    assert run.tokens["a"][0] == [10, 11, STOP], "new tokens stop at the first stop token, inclusive"
    assert all(r["new_tokens"] == [len(prompts[r["batch"]]) + 1] for r in run.rows)


def test_rounds_rotate_the_order_and_time_each_batch_by_its_median(monkeypatch):
    from blockdraft.bench import runner

    log, clock = [], iter([1.0, 9.0, 2.0, 5.0, 4.0, 6.0, 3.0, 7.0, 8.0] * 2)  # seconds of the timed decodes, in turn
    monkeypatch.setattr(runner, "timed", lambda device, fn: (fn(), next(clock)))
    methods = [FakeMethod(n, log) for n in ("a", "b", "c")]
    target = SimpleNamespace(max_positions=512, device=torch.device("cpu"), config=SimpleNamespace(vocab_size=64))
    settings = BenchSettings(block_size=4, max_new_tokens=32, batch_size=1, warmup=False, rounds=3)
    run = run_bench(target, methods, [[10, 11], [12]], settings, [STOP])
    assert [name for name, _, _ in log] == list("abc" "bca" "cab" "bca" "cab" "abc"), "each round rotates by one"
    # Prompt 0: a took 1, 6, 7 (rounds 1-3), b 9, 5, 8, c 2, 4, 3; prompt 1, the clock again: b 1, 6, 7 ...
    seconds = {(r["batch"], r["method"]): r["seconds"] for r in run.rows}
    assert seconds == {(0, "a"): 6.0, (0, "b"): 8.0, (0, "c"): 3.0, (1, "b"): 6.0, (1, "c"): 8.0, (1, "a"): 3.0}
    assert [r["method"] for r in run.rows] == list("abc" "bca"), "rows in the first round's order"
    assert run.rows[0]["round_seconds"] == [1.0, 6.0, 7.0]
    assert run.rows[0]["tokens_per_second"] == 3 / 6.0, "three new tokens over the median"
    assert len(run.stats) == 0 and run.tokens["a"] == [[10, 11, STOP], [12, STOP]]
