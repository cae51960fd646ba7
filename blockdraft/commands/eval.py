"""`blockdraft eval`: online tau with the real decode loop on held-out benchmark prompts."""

from __future__ import annotations

import json
from datetime import date

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..api import encode, load_draft
from ..decode.options import DecodeOptions
from ..errors import InputError
from ..hardware import describe
from ..io.targets import load_target, parse_dtype
from ..prompts import load_prompts
from .common import refuse_training_sets
from .common import add_model_arguments, context_window, prepare


def add_arguments(parser) -> None:
    parser.add_argument("--prompts", default="humaneval,mt-bench", help="comma-separated sets or files")
    parser.add_argument("--limit", type=int, default=20, help="prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--block-size", type=int, default=None, help="K (default: the draft's trained block size)")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")
    parser.add_argument("--tree", action="store_true",
                        help="verify token trees of K nodes (the draft's likeliest alternatives per slot) instead of "
                             "the block: tau then counts what a tree step commits")
    add_model_arguments(parser)


def run(args) -> int:
    from ..train.evaluate import evaluate_online

    for flag, value in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens),
                        ("--batch-size", args.batch_size)):
        if value <= 0:
            raise InputError(f"`{flag}` must be a positive integer, got {value}")
    names = [name for name in args.prompts.split(",") if name]
    if not names:
        raise InputError(f"--prompts {args.prompts!r} names no prompt set; pass e.g. humaneval,mt-bench or a file")
    sets = {name: load_prompts(name, limit=args.limit) for name in names}
    empty = [name for name, prompts in sets.items() if not prompts]
    if empty:
        raise InputError(f"prompt source(s) {empty} gave no prompts; pass sets or files with prompts")
    # Acceptance on the prompts a draft was trained on overstates it, as in bench.
    refuse_training_sets([p for prompts in sets.values() for p in prompts])
    window = context_window(args)
    prepare(args)
    dtype = parse_dtype(args.dtype, args.device)
    target = load_target(args.target, dtype=dtype, device=args.device, weights=args.weights)
    draft = load_draft(args.draft, target, full_vocab=args.full_vocab, ngrams=not args.no_ngrams,
                       context_window=window)
    K = DecodeOptions(block_size=args.block_size).block_size_of(draft.config.block_size)
    dtype_name = str(dtype).removeprefix("torch.")
    shape = f"token trees of {K} nodes" if args.tree else f"K={K}"
    bounded = "" if window is None else f", draft context: first {window.sinks} + latest {window.window} positions"
    table = Table(title=f"online greedy tau, {shape}, max_new_tokens={args.max_new_tokens}, {dtype_name}{bounded}")
    for column in ("set", "prompts", "mean tau", "tau histogram 1..K, >K", "per-position acceptance"):
        table.add_column(column)
    results = {}
    columns = [TextColumn("[bold]eval {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        for name, prompts in sets.items():
            ids = [encode(target, list(p.messages)) for p in prompts]
            task = progress.add_task(name, total=len(ids))
            stats = evaluate_online(target, draft, ids, args.max_new_tokens, K, batch_size=args.batch_size,
                                    on_batch=lambda n, task=task: progress.advance(task, n), tree=args.tree)
            results[name] = stats
    for name, stats in results.items():
        rates = " ".join(f"{r:.2f}" for r in stats.per_position_acceptance())
        table.add_row(name, str(len(sets[name])), f"{stats.mean_tau:.3f}", stats.histogram_text(), rates)
    Console().print(table)
    record = {"date": date.today().isoformat(), "target": target.name, "draft": args.draft or "shipped",
              "full_vocab": args.full_vocab, "prompts": {name: len(prompts) for name, prompts in sets.items()},
              "limit": args.limit, "batch_size": args.batch_size,
              "block_size": K, "tree": args.tree, "max_new_tokens": args.max_new_tokens, "chat_template": True,
              "thinking": False, "draft_window": None if window is None else {"window": window.window,
                                                                              "sinks": window.sinks},
              "hardware": describe(args.device, dtype, target.quantized),
              "results": {k: v.as_dict() for k, v in results.items()}}
    print(json.dumps(record))
    return 0
