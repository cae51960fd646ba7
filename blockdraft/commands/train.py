"""`blockdraft train`: train a draft on a `blockdraft data` folder (torchrun-ready)."""

from __future__ import annotations

from ..errors import ConfigError
from ..io.targets import load_target, parse_dtype
from .common import add_compute_arguments, layer_ids, set_compute


def add_arguments(parser) -> None:
    parser.add_argument("--data", action="append", required=True,
                        help="folder written by `blockdraft data`; repeat to train on several as one set, in order")
    parser.add_argument("--out", required=True, help="run folder: checkpoint/, draft/, metrics.jsonl, curves.png")
    parser.add_argument("--layers", type=int, default=5, help="draft layers (1-8)")
    parser.add_argument("--block-size", type=int, default=16, help="K, the draft's block size")
    parser.add_argument("--gamma", type=float, default=None, help="loss decay (default: 7, 5, 4 for K 16, 10, 8)")
    parser.add_argument("--anchors", type=int, default=512, help="anchors per sequence")
    parser.add_argument("--max-seq-len", type=int, default=3072,
                        help="longest training sequence in tokens (longer ones are cut)")
    parser.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (AdamW, warmup then cosine)")
    parser.add_argument("--epochs", type=int, default=6, help="passes over the data")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per optimizer step (all ranks)")
    parser.add_argument("--micro-batch-size", type=int, default=None,
                        help="sequences per forward pass (gradients accumulate to --batch-size); "
                             "default: the whole batch")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop after this many optimizer steps; default: all epochs")
    parser.add_argument("--save-every", type=int, default=500, help="steps between checkpoints")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="stop after the step that ends past this many seconds of training (a resumed run "
                             "goes on with its checkpoint's seconds), then checkpoint and write the draft; the "
                             "learning-rate schedule ends with the budget")
    parser.add_argument("--save-draft-every-seconds", type=float, default=None, metavar="SECONDS",
                        help="also write the draft folder this often while training (atomically: a run killed "
                             "mid-way leaves a loadable draft)")
    parser.add_argument("--draft-out", default=None, help="folder for the draft (default: OUT/draft)")
    parser.add_argument("--eval-every", type=int, default=500, help="steps between held-out evaluations")
    parser.add_argument("--val-fraction", type=float, default=0.02, help="share of the data held out for evaluation")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draft's initialisation and the data order")
    parser.add_argument("--mask-token-id", type=int, default=None,
                        help="the mask token's id; default: chosen from the tokenizer (docs/training.md §1)")
    parser.add_argument("--target-layer-ids", default=None, help="comma-separated ids (default: the spread rule)")
    parser.add_argument("--init-from", default=None, help="start from this draft folder")
    parser.add_argument("--grow-layers", type=int, default=0, metavar="N",
                        help="append N layers to the --init-from draft, each adding nothing at the start (its "
                             "output projections zero), so training goes on from the same function; --layers counts "
                             "the grown draft's layers")
    parser.add_argument("--init-target-layers", default=None, metavar="IDS",
                        help="start each draft layer from these target layers, e.g. 28,29 (fc starts by selecting "
                             "the deepest tapped layer); one id per draft layer")
    parser.add_argument("--cache-features", action="store_true",
                        help="keep every sequence's target features in memory: the target runs once per sequence "
                             "instead of once per epoch (L*D values a token)")
    parser.add_argument("--feature-store", action="store_true",
                        help="read each sequence's target features from the data folders' stores (written by "
                             "`blockdraft features`) instead of running the target; kept in memory as with "
                             "--cache-features")
    parser.add_argument("--standardize-features", action="store_true",
                        help="train fc on per-dimension standardized target features (folded back into fc in "
                             "every saved draft): evens out the target's few huge feature dimensions")
    parser.add_argument("--loss", choices=("ce", "kd"), default="ce",
                        help="ce: cross-entropy on the target's tokens; kd: also match the target's distribution "
                             "(docs/training.md §3; the teacher's states are cached with --cache-features)")
    parser.add_argument("--kd-weight", type=float, default=None,
                        help="λ of (1-λ)·CE + λ·KD with --loss kd (default 1: pure KD)")
    parser.add_argument("--weighting", choices=("decay", "dpace"), default="decay",
                        help="slot weights: decay exp(-(k-1)/gamma), or dpace from the draft's own acceptance "
                             "(docs/training.md §3)")
    parser.add_argument("--dpace-alpha", type=float, default=0.5, help="D-PACE's acceptance floor α")
    parser.add_argument("--proposal-vocab", action="store_true",
                        help="score only the ids the decoder drafts from (those emitted in the training responses, "
                             "plus each sequence's prompt ids): the LM head, the costliest part of a step on a small "
                             "target, shrinks by V/N")
    parser.add_argument("--head-ids", type=int, default=None, metavar="N",
                        help="score only the N ids most frequent in the training responses (and each sequence's "
                             "prompt ids), leaving out the labels outside them: the head's cost falls to N ids "
                             "and the draft proposes only these (implies --proposal-vocab; docs/training.md §3)")
    parser.add_argument("--head-ids-from", default=None, metavar="DRAFT",
                        help="as --head-ids, over the ids of DRAFT's proposal vocabulary (its blockdraft_vocab.json; "
                             "e.g. the --init-from draft's, so that a continuation over other data keeps its head)")
    parser.add_argument("--cpu-autocast", action="store_true", help="bf16 autocast on CPU (fp32 by default)")
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                        help="torch.compile the draft's forward (a C++ compiler on CPU): 1.55x the steps on a "
                             "2-core Xeon after ~75 s of compiling; auto compiles runs with --time-budget >= 600 "
                             "or >= 500 steps, and runs eager where compiling fails (docs/training.md §7)")
    parser.add_argument("--target", default=None, help="HF folder or hub id (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--target-dtype", default="auto",
                        help="dtype of the frozen target (auto: bfloat16 where it is native, else float32)")
    add_compute_arguments(parser)


def run(args) -> int:
    import torch

    from ..train.ranks import rank_device
    from ..train.trainer import TrainConfig, train

    set_compute(args)
    if args.kd_weight is not None and args.loss != "kd":
        raise ConfigError("--kd-weight only applies with --loss kd; add --loss kd or drop --kd-weight")
    kd_weight = 0.0 if args.loss == "ce" else 1.0 if args.kd_weight is None else args.kd_weight
    ids = layer_ids(args.target_layer_ids, "--target-layer-ids")
    start = layer_ids(args.init_target_layers, "--init-target-layers")
    cfg = TrainConfig(
        data_dirs=args.data, out_dir=args.out, num_draft_layers=args.layers, block_size=args.block_size,
        gamma=args.gamma, anchors=args.anchors, max_seq_len=args.max_seq_len, lr=args.lr, epochs=args.epochs,
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, max_steps=args.max_steps,
        save_every=args.save_every, eval_every=args.eval_every, val_fraction=args.val_fraction, seed=args.seed,
        mask_token_id=args.mask_token_id, target_layer_ids=ids, init_from=args.init_from, init_target_layers=start,
        grow_layers=args.grow_layers,
        cpu_autocast=args.cpu_autocast, cache_features=args.cache_features, feature_store=args.feature_store,
        standardize_features=args.standardize_features, kd_weight=kd_weight,
        weighting=args.weighting, dpace_alpha=args.dpace_alpha, proposal_vocab=args.proposal_vocab,
        head_ids=args.head_ids, head_ids_from=args.head_ids_from,
        time_budget=args.time_budget, save_draft_every_seconds=args.save_draft_every_seconds,
        draft_dir=args.draft_out, compile=args.compile,
    )
    device = rank_device(args.device)
    if device.startswith("cuda:"):
        torch.cuda.set_device(device)  # collectives and barriers of this rank run on its own GPU
    target = load_target(args.target, dtype=parse_dtype(args.target_dtype, device), device=device)
    print(f"draft written to {train(target, cfg)}")
    return 0
