"""benchmarks/headroom.py's arithmetic: what a chain's slot acceptance returns at a width against the width's cost."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from blockdraft.decode.costs import CostModel

spec = importlib.util.spec_from_file_location("headroom", Path(__file__).parents[1] / "benchmarks" / "headroom.py")
headroom = importlib.util.module_from_spec(spec)
spec.loader.exec_module(headroom)

# A plain step of 10 ms; drafted steps of 2 and 4 positions at 15 and 20 ms (1.5 and 2 plain steps).
COSTS = CostModel(plain={1: 0.010}, drafted={1: {2: 0.015, 4: 0.020}})


def test_tokens_cost_and_ratio_per_width():
    rows = headroom.headroom([0.5, 0.5, 0.5], COSTS, goal=1.0, widths=[2, 4])
    # E(2) = 1 + 0.5; E(4) = 1 + 0.5 + 0.25 + 0.125
    assert [r["tokens"] for r in rows] == [1.5, 1.875]
    assert [r["cost"] for r in rows] == [1.5, 2.0]
    assert [r["ratio"] for r in rows] == [1.0, 0.938]
    assert rows[0]["alpha_for_goal"] == pytest.approx(0.5, abs=1e-3), "1 + a = 1.5 at width 2"


def test_no_acceptance_reaches_a_goal_above_the_widths_tokens():
    # 1.5x at width 2 needs 2.25 tokens from a step that returns at most 2
    assert headroom.needed_alpha(1.5 * 1.5, 2) is None
    alpha = headroom.needed_alpha(2.0 * 1.3, 4)  # 1 + a + a^2 + a^3 = 2.6
    assert 1 + alpha + alpha ** 2 + alpha ** 3 == pytest.approx(2.6, abs=1e-6)
