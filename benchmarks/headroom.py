"""What a draft's measured acceptance returns at each verify width, against what that width costs.

    python benchmarks/headroom.py --eval runs/stage25/eval/q4-chain-new.json \
        --costs ~/.cache/blockdraft/costs/<key>.json --goal 1.3

For each prompt set of a `blockdraft eval` JSON (chain steps: its per-slot acceptance, each slot's given the slots
before it) and a step-cost table (decode/costs.py; the cache the decoder wrote, or `break_even.py`'s), it prints
per verify width w (positions, the anchor's included): the tokens a drafted step returns on average, E(w) (bonus
included, as the width policy computes it), the step's cost in plain steps (its break-even tau), their ratio (how
fast drafted steps of that width alone run against the target alone), and the acceptance alpha that, equal at
every slot, would give `--goal`: "-" where even alpha = 1 does not, because the step costs more than `goal` plain
steps per token it can return. The last line is one JSON object. Pure arithmetic over measured numbers: no model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from blockdraft.decode.costs import CostModel
from blockdraft.decode.policy import expected_tokens


def needed_alpha(goal_tokens: float, width: int) -> float | None:
    """The alpha with 1 + alpha + ... + alpha^(width-1) = goal_tokens (bisection), None where above width."""
    if goal_tokens > width:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if sum(mid ** j for j in range(width)) < goal_tokens else (low, mid)
    return high


def headroom(acceptance: list[float], costs: CostModel, goal: float, widths: list[int]) -> list[dict]:
    """One row per width: E(w), cost in plain steps, E(w) / cost, the uniform alpha that gives `goal`."""
    tokens = expected_tokens(torch.tensor(acceptance))  # [K] E(1..K)
    rows = []
    for width in widths:
        cost = costs.break_even(1, width)
        e = float(tokens[min(width, len(tokens)) - 1])
        rows.append({"width": width, "tokens": round(e, 3), "cost": round(cost, 3), "ratio": round(e / cost, 3),
                     "alpha_for_goal": (None if (a := needed_alpha(goal * cost, width)) is None else round(a, 3))})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval", required=True, help="a `blockdraft eval` JSON of chain steps")
    parser.add_argument("--costs", required=True, help="a step-cost table (decode/costs.py JSON)")
    parser.add_argument("--goal", type=float, default=1.3, help="speed against the target alone to solve alpha for")
    parser.add_argument("--widths", default="2,3,4,6,8", help="comma-separated verify widths")
    args = parser.parse_args()

    report = json.loads(Path(args.eval).read_text())
    costs = CostModel.from_json(json.loads(Path(args.costs).expanduser().read_text()))
    widths = [int(w) for w in args.widths.split(",")]
    hardware = report.get("hardware", {})
    print(f"{hardware.get('device', '?')}; target {hardware.get('weights', hardware.get('dtype', '?'))}; draft "
          f"{report.get('draft')}; plain step {costs.seconds(1, 1, False) * 1e3:.1f} ms; goal {args.goal}x")
    out = {"eval": args.eval, "costs": args.costs, "goal": args.goal, "sets": {}}
    for name, result in report["results"].items():
        rows = headroom(result["per_position_acceptance"], costs, args.goal, widths)
        out["sets"][name] = rows
        print(f"\n{name}: slot acceptance {', '.join(f'{a:.2f}' for a in result['per_position_acceptance'][:4])}; "
              f"chain tau {result['mean_tau']}")
        print(f"  {'width':>5} {'E(w)':>6} {'cost':>6} {'ratio':>6} {'alpha for goal':>15}")
        for row in rows:
            alpha = "-" if row["alpha_for_goal"] is None else f"{row['alpha_for_goal']:.2f}"
            print(f"  {row['width']:>5} {row['tokens']:>6.3f} {row['cost']:>6.3f} {row['ratio']:>6.3f} {alpha:>15}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
