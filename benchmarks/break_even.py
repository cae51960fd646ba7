"""Break-even tau: how many tokens a drafted step must return to pay for itself, at today's step costs.

    python benchmarks/break_even.py --threads 2                 # bf16 and q4 targets, the shipped draft, chain
    python benchmarks/break_even.py --weights q4 --tree

For each target precision the cost model (decode/costs.py) is measured afresh (not read from the cache), as the
width policy uses it, and printed as: the plain step (one position, the target alone), and for each verify width
the drafted step's cost and its break-even tau (that cost in plain steps; a step's tau counts the bonus token).
A draft whose tau at a width stays under its break-even makes decoding slower there; the policy then narrows or
stops drafting. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json

import torch

from blockdraft.hardware import describe_line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", default="bf16,q4", help="comma-separated target precisions: bf16, q4")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--tree", action="store_true", help="token-tree steps instead of chain blocks")
    parser.add_argument("--rows", type=int, default=1, help="batch rows")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from blockdraft.decode.decoder import Decoder
    from blockdraft.decode.options import DecodeOptions
    from blockdraft.io.drafts import load_draft
    from blockdraft.io.targets import load_target

    print(describe_line(), f"torch {torch.__version__}, {args.threads} threads, batch {args.rows}, "
          f"{'tree' if args.tree else 'chain'} steps, the shipped draft")
    report = {}
    for weights in args.weights.split(","):
        target = load_target(weights=weights)
        draft = load_draft(None, target)
        options = DecodeOptions(tree=args.tree, lookup=False)
        costs = Decoder(target, draft, options, measure_costs=True).costs(args.rows)
        bucket = costs._bucket(args.rows)
        plain = costs.plain[bucket]
        widths = sorted(costs.drafted[bucket])
        rows = {w: {"ms": costs.drafted[bucket][w] * 1e3, "break_even_tau": costs.break_even(args.rows, w)}
                for w in widths}
        report[weights] = {"plain_ms": plain * 1e3, "per_position_ms": costs.per_position(args.rows) * 1e3,
                           "drafted": rows}
        print(f"{weights}: plain step {plain * 1e3:.2f} ms; "
              + "; ".join(f"{w} positions {r['ms']:.2f} ms (break-even tau {r['break_even_tau']:.2f})"
                          for w, r in rows.items()))
    print(json.dumps({"threads": args.threads, "rows": args.rows, "tree": args.tree, "costs": report}))


if __name__ == "__main__":
    main()
