"""`blockdraft features --data DATA`: write the target's tapped features of a data folder beside its shards."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import ConfigError
from ..io.targets import load_target, parse_dtype
from .common import add_compute_arguments, layer_ids, set_compute


def add_arguments(parser) -> None:
    parser.add_argument("--data", action="append", required=True,
                        help="folder written by `blockdraft data` (repeat for several)")
    parser.add_argument("--draft", default=None,
                        help="tap the target layers this draft folder's config names (default: the shipped draft)")
    parser.add_argument("--target-layer-ids", default=None,
                        help="comma-separated layer ids to tap instead of a draft's (as `train --target-layer-ids`)")
    parser.add_argument("--kd", action="store_true",
                        help="also store the final layer, the teacher states `train --loss kd` reads")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per target forward")
    parser.add_argument("--target", default=None, help="HF folder or hub id (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--target-dtype", default="auto",
                        help="dtype of the target, as `train --target-dtype` (the store is kept per dtype)")
    add_compute_arguments(parser)


def tap_ids(args, num_layers: int) -> tuple[int, ...]:
    """The layers to tap: --target-layer-ids, else the draft's; the final layer added for --kd."""
    from ..io.checkpoint import read_config
    from ..io.drafts import DEFAULT_DRAFT

    ids = layer_ids(args.target_layer_ids, "--target-layer-ids")
    if ids is None:
        ids = tuple(read_config(args.draft or DEFAULT_DRAFT).target_layer_ids)
    if any(not 0 <= i < num_layers for i in ids):
        raise ConfigError(f"tapped layer ids {list(ids)} must lie in 0..{num_layers - 1} for this target; pass "
                          "--target-layer-ids or the draft trained for this target")
    return ids + ((num_layers - 1,) if args.kd else ())


def run(args) -> int:
    from ..train.feature_store import build_store, store_dir
    from ..train.data import shard_files

    set_compute(args)
    if args.batch_tokens < 1:
        raise ConfigError(f"--batch-tokens must be positive, got {args.batch_tokens}")
    target = load_target(args.target, dtype=parse_dtype(args.target_dtype, args.device), device=args.device,
                         weights=None)
    ids = tap_ids(args, target.num_layers)
    shards = {folder: len(shard_files(Path(folder))) for folder in args.data}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    lines = []
    with Progress(*columns, console=Console(stderr=True)) as progress:  # stdout keeps the JSON lines alone
        for folder, count in shards.items():
            task = progress.add_task(f"features of {folder}", total=count)
            done = build_store(target, folder, ids, batch_tokens=args.batch_tokens,
                               on_shard=lambda n, task=task: progress.advance(task, n))
            lines.append({"folder": folder, "store": str(store_dir(folder, target, ids)), **done})
    for line in lines:
        print(json.dumps(line))
    return 0
