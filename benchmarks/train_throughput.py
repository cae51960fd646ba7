"""Training sequences a minute, two arms in one process on the same data and settings, alternated for `--rounds`:
`--compare store` (the default), the target run at every step against features read from the store; `--compare
compile`, both from the store, the draft's forward eager against torch.compile (`blockdraft train --compile`).
Three recipes (`--recipe`): `stage9`, the shipped draft's (2 layers, K=8, 96 anchors, standardized features, KD 0.5
over the proposal vocabulary); `k4`, the one the A/B at equal CPU time kept (the same but K=4, gamma 4, plain
cross-entropy: no teacher pass); `k8`, the CPU continuations' (K=8, gamma 4, plain cross-entropy); bf16 autocast
where bf16 is native. `--head-ids N` scores only the N most frequent response ids in both arms.

    python benchmarks/train_throughput.py --data datasets/smollm2-135m-instruct/gpu-a --sequences 96 --steps 10
    python benchmarks/train_throughput.py --data datasets/smollm2-135m-instruct/gpu-a --recipe k4
    python benchmarks/train_throughput.py --data datasets/smollm2-135m-instruct/gpu-a --recipe k4 --head-ids 8192
    python benchmarks/train_throughput.py --data datasets/smollm2-135m-instruct/gpu-a --recipe k8 --head-ids 8192 \
        --compare compile --steps 13 --rounds 2

The first `--sequences` examples of the folder are copied into a scratch folder; each arm trains `--steps`
optimizer steps of 8 sequences from the shipped draft, timed from the end of its first step (one-off costs
excluded: the compile is in the first step, printed apart) to the end of its last. The store's build is timed
apart: it is paid once per data folder, not per run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import torch


def timed_steps(target, cfg) -> tuple[float, int, float]:
    """(seconds from the end of the first optimizer step to the end of the last, those steps, the first step's
    seconds from the start of training)."""
    from blockdraft.train.trainer import train

    start = time.perf_counter()
    marks = []
    train(target, cfg, on_step=lambda step: marks.append(time.perf_counter()))
    return marks[-1] - marks[0], len(marks) - 1, marks[0] - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--sequences", type=int, default=96)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recipe", choices=("stage9", "k4", "k8"), default="stage9")
    parser.add_argument("--compare", choices=("store", "compile"), default="store")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--head-ids", type=int, default=None, help="score only the N most frequent response ids")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from blockdraft.hardware import describe_line
    from blockdraft.io.drafts import DEFAULT_DRAFT
    from blockdraft.io.targets import load_target
    from blockdraft.model.kernels import cpu_paths
    from blockdraft.train.data import read_examples, write_shard
    from blockdraft.train.feature_store import build_store
    from blockdraft.train.trainer import TrainConfig

    target = load_target(weights=None)
    scratch = Path(tempfile.mkdtemp(prefix="throughput-"))
    (scratch / "data").mkdir()
    write_shard(scratch / "data" / "data-00000.jsonl", read_examples(args.data, target.tokenizer)[: args.sequences])
    base = dict(data_dirs=scratch / "data", num_draft_layers=2, block_size=8, anchors=96, max_seq_len=640,
                lr=2e-4, epochs=100, max_steps=args.steps + 1, batch_size=8, micro_batch_size=4, save_every=10**6,
                eval_every=10**6, val_fraction=0.0, seed=12, mask_token_id=16, target_layer_ids=(1, 27),
                init_from=str(DEFAULT_DRAFT), standardize_features=True, kd_weight=0.5, proposal_vocab=True,
                cpu_autocast=cpu_paths().native_bf16, head_ids=args.head_ids)
    if args.recipe in ("k4", "k8"):
        base.update(block_size=4 if args.recipe == "k4" else 8, gamma=4.0, kd_weight=0.0)
    taps = (1, 27) if args.recipe != "stage9" else (1, 27, target.num_layers - 1)  # KD's teacher: the final layer
    start = time.perf_counter()
    built = build_store(target, scratch / "data", taps)
    build_seconds = time.perf_counter() - start
    if args.compare == "store":
        arms = {"target every step": {}, "feature store": {"feature_store": True}}
    else:
        arms = {"compiled": {"feature_store": True, "compile": "on"}, "eager": {"feature_store": True}}
    rows = []
    for rnd in range(args.rounds):
        for name, extra in arms.items():
            out = scratch / f"{name.replace(' ', '-')}-{rnd}"
            seconds, steps, first = timed_steps(target, TrainConfig(out_dir=out, **base, **extra))
            rows.append({"arm": name, "round": rnd, "seconds": round(seconds, 2), "steps": steps,
                         "first_step_seconds": round(first, 1),
                         "sequences_per_minute": round(steps * base["batch_size"] * 60 / seconds, 1)})
    print(f"{describe_line('cpu', target.dtype)}; recipe {args.recipe}; {args.sequences} sequences of {args.data}, "
          f"{args.steps} steps of 8; head over {args.head_ids or 'the proposal vocabulary'}")
    for r in rows:
        print(f"  round {r['round']} {r['arm']:18s} {r['sequences_per_minute']:7.1f} sequences/min ({r['steps']} steps "
              f"in {r['seconds']} s; first step {r['first_step_seconds']} s)")
    medians = {name: median(r["sequences_per_minute"] for r in rows if r["arm"] == name) for name in arms}
    faster, baseline = ("feature store", "target every step") if args.compare == "store" else ("compiled", "eager")
    ratio = medians[faster] / medians[baseline]
    label = f"{faster} / {baseline}"
    print(f"  {label}: {ratio:.2f}x (medians over rounds); the store's build: {build_seconds:.1f} s for "
          f"{built['sequences']} sequences ({built['tokens']:,} tokens), once per data folder")
    print(json.dumps({"recipe": args.recipe, "compare": args.compare, "head_ids": args.head_ids,
                      "sequences": args.sequences, "rows": rows, "ratio": round(ratio, 3),
                      "build_seconds": round(build_seconds, 1), "built": built}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
