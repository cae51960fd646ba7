"""How to time step costs so that they price a step as decodes then pay for it: two designs, several statistics.

    python benchmarks/cost_statistic.py --weights q4 --measurements 8

The cost model (blockdraft/decode/costs.py) prices each kind of the default mode's steps (plain, drafted trees of
2-16 nodes, ragged steps of 1-8 extra positions) from a few timed steps. Two designs of the timing, measured in
turn in one process, `--measurements` times each, every sample kept:

- blocks: each kind timed in a decode of its own, the kinds one after another, `--rounds` rounds (the cost
  model's design up to 2026-12-06, which priced each kind by its fastest step);
- cycle: every kind in turn, step after step, in one decode, `--rounds` rounds (the cost model's design now).

Each design's reference is the mean of each kind over all its samples: what a decode pays for that kind's steps
on average. Each statistic is then taken over one measurement's samples, as the cost model takes it, and its
ratio t(kind) / t(plain) (the cost in plain steps that the width policy weighs: break-even tau) compared with the
reference's: the median error over kinds and measurements, the median absolute error, and the worst either way.
A priced ratio below the reference makes speculation look cheaper than it is. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from blockdraft.decode import costs, measure
from blockdraft.decode.decoder import as_drafter
from blockdraft.hardware import describe_line
from blockdraft.io.drafts import load_draft
from blockdraft.io.targets import load_target


PLAIN = costs.PLAIN


def per_kind(statistic):
    """A statistic of each kind's samples alone, as a ratio to the plain step's."""
    return lambda times: {k: statistic(v) / statistic(times[PLAIN]) for k, v in times.items() if k != PLAIN}


def paired_median(times):
    """The median over cycles of a kind's seconds over the same cycle's plain step's (the cost model's)."""
    priced = costs.priced(times)
    return {k: v / priced[PLAIN] for k, v in priced.items() if k != PLAIN}


CANDIDATES = {
    "blocks": {"min": per_kind(min), "median": per_kind(statistics.median)},
    "cycle": {"min": per_kind(min), "median": per_kind(statistics.median), "paired median": paired_median},
}


def timed(target, drafter, design: str, kinds, rounds: int) -> dict:
    """One measurement of `design`: each kind's timed seconds over `rounds` rounds."""
    times: dict = {kind: [] for kind in kinds}
    for _ in range(rounds):
        groups = [kinds] if design == "cycle" else [[kind] for kind in kinds]
        for group in groups:
            out = measure.timed_kinds(target, drafter, True, 1, group, costs.WARM_STEPS + costs.STEPS_PER_ROUND)
            for kind, seconds in out.items():
                times[kind] += seconds[costs.WARM_STEPS:]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", choices=["q4", "bf16", "float32"], default="q4")
    parser.add_argument("--measurements", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=costs.ROUNDS, help="rounds of one measurement")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(weights=args.weights) if args.weights != "float32" else load_target(dtype="float32")
    drafter = as_drafter(target, load_draft(None, target), None)
    kinds = costs.step_kinds(measure.timed_widths(2 * drafter.block_size), 1, ragged=True)  # the cost model's
    print(describe_line(), f"torch {torch.__version__}, {args.threads} threads, weights {args.weights}, "
          f"{args.measurements} measurements of each design, {args.rounds} rounds x {costs.STEPS_PER_ROUND} steps")
    runs: dict = {design: [] for design in CANDIDATES}
    for m in range(args.measurements):
        for design in CANDIDATES:
            runs[design].append(timed(target, drafter, design, kinds, args.rounds))
        print(f"measurement {m + 1}: plain min {min(runs['cycle'][-1][PLAIN]) * 1e3:.2f} ms (cycle), "
              f"{min(runs['blocks'][-1][PLAIN]) * 1e3:.2f} (blocks)", flush=True)
    report, references = {}, {}
    for design, statistics_ in CANDIDATES.items():
        reference = {k: statistics.mean(s for run in runs[design] for s in run[k]) for k in kinds}
        references[design] = reference
        truth = {k: reference[k] / reference[PLAIN] for k in kinds if k != PLAIN}
        for name, statistic in statistics_.items():
            errors = [ratio / truth[k] - 1 for run in runs[design] for k, ratio in statistic(run).items()]
            report[f"{design}: {name}"] = dict(
                median_error=statistics.median(errors), median_abs_error=statistics.median(abs(e) for e in errors),
                worst_low=min(errors), worst_high=max(errors))
    for design, reference in references.items():
        print(f"reference, {design} (mean over all samples): " + ", ".join(
            f"{kind} {n}: {reference[kind, n] * 1e3:.1f} ms" for kind, n in kinds))
    print(f"{'design: statistic':28s} {'median error':>12s} {'median |error|':>14s} {'worst low':>10s} "
          f"{'worst high':>10s}   (priced t/t_plain against the reference's)")
    for name, row in report.items():
        print(f"{name:28s} {row['median_error']:+12.1%} {row['median_abs_error']:14.1%} {row['worst_low']:+10.1%} "
              f"{row['worst_high']:+10.1%}")
    print(json.dumps(dict(weights=args.weights, measurements=args.measurements, rounds=args.rounds,
                          steps=costs.STEPS_PER_ROUND, statistics=report,
                          reference_ms={d: {f"{k} {n}": v * 1e3 for (k, n), v in r.items()}
                                        for d, r in references.items()},
                          samples_ms={d: [{f"{k} {n}": [x * 1e3 for x in v] for (k, n), v in run.items()}
                                          for run in rs] for d, rs in runs.items()})))


if __name__ == "__main__":
    main()
