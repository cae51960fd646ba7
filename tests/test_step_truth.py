"""benchmarks/step_truth.py's log of a decode's steps: each step recorded once, by kind, priced by the cost model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import blockdraft.decode.generate as generate
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.options import PRESETS

from step_fakes import COSTS
from tiny_models import random_prompts, tiny_draft, tiny_target

spec = importlib.util.spec_from_file_location("step_truth", Path(__file__).parents[1] / "benchmarks" /
                                              "step_truth.py")
step_truth = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_truth)


def test_every_step_of_a_default_decode_is_logged_once_with_its_tokens_and_price():
    target = tiny_target("llama")
    decoder = Decoder(target, tiny_draft(target, block_size=8), PRESETS["default"])
    prompt = random_prompts([12], seed=3)[0]
    plain = decoder.generate([prompt], max_new_tokens=40)[0]
    with step_truth.StepLog(generate) as log:
        logged = decoder.generate([prompt], max_new_tokens=40)[0]
    assert generate.step is log.step  # put back on leaving
    assert logged.tokens == plain.tokens  # the log changes nothing the decode does
    assert len(log.records) == sum(logged.stats.histogram)
    assert sum(r["tokens"] for r in log.records) == len(logged.tokens) - 1  # the prefill's token is no step
    for r in log.records:
        assert r["kind"] in ("plain", "ragged", "drafted")
        assert (r["nodes"] == 1) == (r["kind"] == "plain")
        if r["kind"] == "drafted":  # priced as the cost model prices a drafted step of its nodes
            assert r["priced"] == COSTS.seconds(1, r["nodes"], drafted=True)
            assert r["expected"] >= 1.0
    kinds = step_truth.summarise(log.records)
    assert "drafted" in kinds  # the fixed costs price drafting cheap: the draft runs
    assert sum(k["steps"] for k in kinds.values()) == len(log.records)


def test_a_summary_counts_tokens_per_second_of_each_kind():
    records = [dict(kind="plain", nodes=1, seconds=0.01, priced=0.01, tokens=1, expected=1.0, lookup=False),
               dict(kind="plain", nodes=1, seconds=0.03, priced=0.01, tokens=1, expected=1.0, lookup=False),
               dict(kind="drafted", nodes=4, seconds=0.02, priced=0.015, tokens=3, expected=2.0, lookup=False)]
    kinds = step_truth.summarise(records)
    assert kinds["plain"]["tokens_per_s"] == 2 / 0.04
    assert kinds["plain"]["priced_ms_per_step"] == 10.0
    assert kinds["drafted"]["tokens_per_s"] == 3 / 0.02
    assert kinds["drafted"]["expected_tokens"] == 2.0 and kinds["plain"]["expected_tokens"] is None
