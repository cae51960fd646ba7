"""What a draft geometry costs a decode step on this machine, and the tau it must reach to pay.

    python benchmarks/geometry_costs.py --threads 2            # bf16 and q4 targets, four geometries

For each draft geometry (tapped target layers, draft layers, block size K) a draft of that shape is built (random
weights: a step's cost does not depend on them) with the shipped draft's proposal vocabulary, and the cost model
the width policy reads is measured afresh for chain steps (decode/costs.py). Printed per geometry: the plain step,
the drafted step at 2, 4 and K positions, and the break-even tau at each (the drafted step's cost in plain steps:
the tokens a step must return, bonus included, to beat the target alone). A draft trained at K = 16 can serve at 8
(`--block-size 8`); that row is the K = 16 geometry's. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json

import torch

from blockdraft.hardware import describe_line

GEOMETRIES = {  # name: (tapped target layers, draft layers, K)
    "today: 2 taps, 2 layers, K=8": ((1, 27), 2, 8),
    "2 taps, 5 layers, K=8": ((1, 27), 5, 8),
    "reference: 5 taps, 5 layers, K=16": ((1, 8, 14, 20, 27), 5, 16),
    "5 taps, 2 layers, K=16": ((1, 8, 14, 20, 27), 2, 16),
}


def geometry_draft(target, taps, layers: int, block_size: int, vocab):
    from blockdraft.config import DraftConfig, choose_mask_token_id
    from blockdraft.io.drafts import LoadedDraft, place
    from blockdraft.model.draft import DFlashDraftModel

    cfg = DraftConfig.for_target(target.config, num_draft_layers=layers, block_size=block_size,
                                 mask_token_id=choose_mask_token_id(target.tokenizer, target.config),
                                 target_layer_ids=taps)
    module = DFlashDraftModel(cfg)
    module.init_weights(generator=torch.Generator().manual_seed(0))
    return place(LoadedDraft(module, trained=True, vocab=vocab), target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", default="bf16,q4", help="comma-separated target precisions: bf16, q4")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from blockdraft.decode.decoder import Decoder
    from blockdraft.decode.options import DecodeOptions
    from blockdraft.io.drafts import load_draft
    from blockdraft.io.targets import load_target

    print(describe_line(), f"torch {torch.__version__}, {args.threads} threads, batch 1, chain steps")
    report = {}
    for weights in args.weights.split(","):
        target = load_target(weights=weights)
        vocab = load_draft(None, target).vocab  # the shipped draft's proposal vocabulary, for every geometry
        for name, (taps, layers, K) in GEOMETRIES.items():
            for served in sorted({K, 8}):
                draft = geometry_draft(target, taps, layers, K, vocab)
                chain = DecodeOptions(block_size=served, tree=False, lookup=False)
                costs = Decoder(target, draft, chain, measure_costs=True).costs(1)
                plain = costs.plain[1]
                widths = sorted({2, 4, served})
                row = {"plain_ms": plain * 1e3,
                       "drafted_ms": {w: costs.seconds(1, w, drafted=True) * 1e3 for w in widths},
                       "break_even_tau": {w: costs.break_even(1, w) for w in widths}}
                report[f"{weights} | {name} | served K={served}"] = row
                print(f"{weights} | {name} | served K={served}: plain {plain * 1e3:.1f} ms; " + "; ".join(
                    f"{w} positions {row['drafted_ms'][w]:.1f} ms (break-even tau {row['break_even_tau'][w]:.2f})"
                    for w in widths), flush=True)
    print(json.dumps({"threads": args.threads, "geometries": report}))


if __name__ == "__main__":
    main()
