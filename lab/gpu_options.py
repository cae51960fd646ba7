"""The options of `gpu_train.sh run` (and `plan`): paths, the time budget of each stage, the draft geometries,
data, eval and bench; and the whole window's seconds that they add up to."""

from __future__ import annotations

import os
from pathlib import Path

SETUP_SECONDS = 60  # join, sha256, wheel, the GGUF's conversion, the greedy check: under a minute on the GPU machine
DEFAULT_LAYER_IDS = (1, 8, 14, 20, 27)


def add_run_arguments(run) -> None:
    paths = run.add_argument_group("paths (relative ones from the repository root)")
    paths.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                       help="everything returned goes here; must be empty (default: $OUT)")
    paths.add_argument("--work", type=Path, default=Path("/tmp/gpu-window"), help="data, run folder, caches")
    paths.add_argument("--parts-dir", type=Path, default=Path("/tmp"), help="where the `part I` calls put part_*")
    paths.add_argument("--sha256-file", type=Path, default=None, help="default: the last .gpu_N/sha256")
    paths.add_argument("--wheel-dir", type=Path, default=Path(".whl"))
    paths.add_argument("--site", type=Path, default=Path("/tmp/site"), help="where the wheels are installed")
    paths.add_argument("--no-install", action="store_true", help="gguf is installed already (a CPU dry run)")
    paths.add_argument("--prompts-dir", type=Path, default=Path(".gpudata/prompts"), help="`prep`'s extracts")
    paths.add_argument("--data-in", type=Path, action="append", default=None,
                       help="a carried `blockdraft data` folder trained on too, once per folder (default: "
                            ".gpudata/data if present)")
    paths.add_argument("--reference", type=Path, default=Path("lab/gpu_reference.json"))
    budget = run.add_argument_group("time (seconds)")
    budget.add_argument("--data-seconds", type=float, default=90, help="0: train on --data-in only")
    budget.add_argument("--train-seconds", type=float, default=180, help="of training steps (--time-budget)")
    budget.add_argument("--train-grace", type=float, default=45,
                        help="beyond --train-seconds for start-up, held-out metrics and the final checkpoint")
    budget.add_argument("--draft-every", type=float, default=60, help="seconds between drafts written while training")
    budget.add_argument("--eval-seconds", type=float, default=50)
    budget.add_argument("--bench-seconds", type=float, default=110, help="shared evenly by the --bench-runs")
    budget.add_argument("--deadline", type=float, default=None,
                        help=f"the whole job; default: {SETUP_SECONDS} s of setup plus the budgets above")
    draft = run.add_argument_group("draft and training")
    draft.add_argument("--layers", type=int, default=5)
    draft.add_argument("--block-size", type=int, default=16)
    draft.add_argument("--target-layer-ids", type=_ids, default=DEFAULT_LAYER_IDS)
    draft.add_argument("--gamma", type=float, default=None, help="default: the trainer's (7 for K 16)")
    draft.add_argument("--batch-size", type=int, default=32)
    draft.add_argument("--micro-batch-size", type=int, default=8)
    draft.add_argument("--epochs", type=int, default=6)
    draft.add_argument("--train-extra", default="", help="more `blockdraft train` options, e.g. '--proposal-vocab'")
    rival = run.add_argument_group("a second geometry, trained beside the first on the same data and clock")
    rival.add_argument("--second-layers", type=int, default=2, help="its draft layers; 0: train one draft only")
    rival.add_argument("--second-target-layer-ids", type=_ids, default=None, help="default: --target-layer-ids")
    rival.add_argument("--second-block-size", type=int, default=None, help="default: --block-size")
    rival.add_argument("--second-margin", type=float, default=0.5,
                       help="the second draft is returned instead of the first when its eval tau is at most this "
                            "much below the first's: what the first's extra layers cost a CPU step in tokens")
    data = run.add_argument_group("data")
    data.add_argument("--data-batch-size", type=int, default=512)
    data.add_argument("--data-slice", type=int, default=512, help="prompts added per `blockdraft data` call")
    data.add_argument("--data-max-new-tokens", type=int, default=256)
    data.add_argument("--no-magpie", action="store_true", help="only the carried prompts, no prompts the target writes")
    data.add_argument("--data-answers", type=int, default=1,
                      help="answers a prompt: 1, the greedy one; more, sampled at --data-temperature, over the "
                           "carried folders' prompts too (sampled answers are new text for them)")
    data.add_argument("--data-temperature", type=float, default=0.8, help="of sampled answers (--data-answers > 1)")
    data.add_argument("--data-extra", default="", help="more `blockdraft data` options, e.g. '--magpie-fraction 0.1'")
    measure = run.add_argument_group("eval and bench")
    measure.add_argument("--eval-sets", default="humaneval,mt-bench")
    measure.add_argument("--eval-limit", type=int, default=8, help="prompts per set")
    measure.add_argument("--eval-max-new-tokens", type=int, default=128)
    measure.add_argument("--eval-batch-size", type=int, default=8)
    measure.add_argument("--eval-block-size", type=int, default=8, help="K served in eval (a CPU serves 8)")
    measure.add_argument("--bench-set", default="humaneval")
    measure.add_argument("--bench-methods", default="ours-baseline,hf-generate,blockdraft-lookup",
                         help="blockdraft-lookup is the default mode")
    measure.add_argument("--bench-runs", type=_runs, default=((1, 2), (8, 8)), help="BATCH:PROMPTS,...")
    measure.add_argument("--bench-max-new-tokens", type=int, default=128)
    run.add_argument("--device", default="cuda")
    run.add_argument("--threads", type=int, default=None, help="torch CPU threads of every stage")


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(i) for i in text.split(","))


def _runs(text: str) -> tuple[tuple[int, int], ...]:
    return tuple((int(b), int(n)) for b, n in (item.split(":") for item in text.split(",")))


def window_seconds(args) -> float:
    """The whole job: setup, then each stage's budget."""
    if args.deadline is not None:
        return args.deadline
    return (SETUP_SECONDS + args.data_seconds + args.train_seconds + args.train_grace + args.eval_seconds
            + args.bench_seconds)
