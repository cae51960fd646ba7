"""`blockdraft bench`: same-run benchmark of the target alone, HF generate, prompt lookup and speculative decoding.

Prints the tables, writes OUT/bench.json and OUT/bench.png, and ends stdout with one JSON line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..api import encode, load_draft
from ..bench import BenchSettings, benchmark
from ..bench.methods import METHODS, REQUIRED, choose_methods
from ..bench.plot import save_plot
from ..bench.report import render, save_json, summary_line
from ..decode.options import DecodeOptions
from ..decode.requests import check_request
from ..errors import InputError
from ..io.drafts import DEFAULT_DRAFT
from ..io.targets import EMBEDDED_TARGET, embedded_gguf_path, load_target, parse_dtype
from ..prompts import benchmark_set_names, load_prompts
from ..sampling import SamplingParams
from . import bench_serve
from .common import (add_model_arguments, add_sampling_arguments, context_window, layer_ids, prepare,
                     refuse_training_sets, writable_folder)


def add_arguments(parser) -> None:
    # `blockdraft bench serve ...` loads a server (bench_serve.py); without a mode, `bench` runs as it always has.
    modes = parser.add_subparsers(dest="mode", title="modes", metavar="{serve}")
    serve_help = "the serving load bench: `blockdraft serve` under a sweep of concurrency levels or request rates"
    bench_serve.add_arguments(modes.add_parser("serve", help=serve_help, description=serve_help,
                                               formatter_class=parser.formatter_class))
    sets = ", ".join(benchmark_set_names())
    parser.add_argument("--prompts", default="mt-bench", help=f"a benchmark set ({sets}) or a .jsonl/.txt file")
    parser.add_argument("--limit", type=int, default=10, help="use the first N prompts of the set")
    parser.add_argument("--block-size", type=int, default=None, help="K (default: the draft's trained block size)")
    parser.add_argument("--max-new-tokens", type=int, default=256,
                        help="new tokens per prompt (each method's outputs are cut to the same tokens)")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="prompts decoded together by batched methods (prompt lookup always runs one at a time)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="decodes of each batch by each method, interleaved, the order rotating each round; a "
                             "batch's time is the median of its rounds (steadier ratios on a shared machine)")
    parser.add_argument("--methods", default=None,
                        help=f"comma-separated methods to run (default: all): {', '.join(METHODS)}; "
                             f"{' and '.join(REQUIRED)} always run")
    parser.add_argument("--llama-draft-max", default="2",
                        help="llama-cpp-dflash: llama.cpp's draft length (--spec-draft-n-max); a comma-separated "
                             "list runs one method per length (default 2: the fastest of 2, 3, 4 and 8 measured on "
                             "a 2-core CPU)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for bench.json and bench.png")
    parser.add_argument("--measure-costs", action="store_true",
                        help="time the step costs that price adaptive widths again (in the warm-up), replacing the "
                             "cached ones: after they were measured on a busier machine")
    sampling = add_sampling_arguments(parser, "every method samples with these (default: greedy); texts are then "
                                      "compared only with --sampler coupled, and only ours", 0,
                                      "base seed of every method's samples (default 0)")
    sampling.add_argument("--sampler", choices=("rejection", "coupled"), default="rejection",
                          help="how ours sample: rejection (as unseeded requests do), or coupled (as seeded ones "
                               "do: the same seeds give ours-baseline's sample, so ours' texts are compared)")
    add_model_arguments(parser)


def run(args) -> int:
    if args.mode == "serve":
        return bench_serve.run(args)
    for flag, value in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens),
                        ("--batch-size", args.batch_size), ("--rounds", args.rounds)):
        if value <= 0:
            raise InputError(f"`{flag}` must be a positive integer, got {value}")
    methods = choose_methods(args.methods)  # a misspelt method fails before anything loads
    llama_draft_max = layer_ids(args.llama_draft_max, "--llama-draft-max", "draft lengths such as 2,3,4,8")
    if not llama_draft_max or min(llama_draft_max) < 1:
        raise InputError(f"`--llama-draft-max` must list draft lengths >= 1, got {args.llama_draft_max!r}")
    window = context_window(args)
    prepare(args)
    # Bad sampling parameters fail here too, with SamplingParams' message naming the parameter and the fix.
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                              seed=args.seed)
    if sampling.greedy:
        ignored = [flag for flag, on in (("--top-p", args.top_p != 1.0), ("--top-k", args.top_k != 0),
                                         ("--min-p", args.min_p != 0.0), ("--sampler", args.sampler != "rejection"))
                   if on]
        if ignored:
            Console(stderr=True).print(f"[yellow]note: {', '.join(ignored)} ignored at temperature 0 (greedy); "
                                       "pass --temperature to sample[/yellow]")
    # Prompts first: a wrong set name or a bad file line fails in milliseconds, before the model loads.
    prompts = load_prompts(args.prompts, args.limit)
    if not prompts:
        raise InputError(f"prompt source {args.prompts!r} gave no prompts; pass a set or file with prompts")
    if args.batch_size > len(prompts):
        raise InputError(f"`--batch-size` {args.batch_size} is more than the {len(prompts)} prompts: every batch "
                         f"would hold {len(prompts)}; lower --batch-size, or raise --limit")
    writable_folder(args.out, ("bench.json", "bench.png"))  # before minutes of measuring, not after
    refuse_training_sets(prompts)
    stderr = Console(stderr=True, highlight=False)
    with stderr.status("loading target and draft"):
        target = load_target(args.target, dtype=parse_dtype(args.dtype, args.device), device=args.device,
                             weights=args.weights)
        draft = load_draft(args.draft, target, full_vocab=args.full_vocab, ngrams=not args.no_ngrams,
                           context_window=window)
    if not getattr(draft, "trained", True):
        stderr.print("[yellow]note: no trained draft is shipped yet; using an UNTRAINED draft "
                     "(output is exact, acceptance is near 1)[/yellow]")
    ids = [_encode(target, p.messages) for p in prompts]
    block_size = DecodeOptions(block_size=args.block_size).block_size_of(draft.config.block_size)
    check_request(target, ids, args.max_new_tokens, block_size, draft.config.block_size,
                  names=[f"{p.set}:{p.id}" for p in prompts])
    settings = BenchSettings(block_size=block_size, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                             methods=methods, sampling=None if sampling.greedy else sampling,
                             coupled=DecodeOptions(sampling=sampling, sampler=args.sampler).coupled,
                             llama_draft_max=tuple(llama_draft_max), measure_costs=args.measure_costs,
                             rounds=args.rounds)
    context = {"prompt_set": args.prompts, "limit": args.limit, "target": target.name,
               "draft": str(args.draft) if args.draft else "shipped", "draft_trained": getattr(draft, "trained", True),
               "draft_window": None if window is None else {"window": window.window, "sinks": window.sinks},
               "full_vocab": args.full_vocab, "proposal_vocab_size": _vocab_size(draft),
               "ngram_contexts": len(getattr(draft, "ngrams", None) or ())}
    draft_folder = _draft_folder(args.draft)
    return report(target, draft, ids, settings, args.out, prompt_ids=[f"{p.set}:{p.id}" for p in prompts],
                  context=context, draft_folder=draft_folder, gguf=_target_gguf(args.target))


def report(target, draft, prompts: list[list[int]], settings: BenchSettings, out: Path, **kwargs) -> int:
    """Benchmark with a progress bar on stderr; tables on stdout, files in `out`, the JSON line last."""
    # A pipe or file gets a fixed width: rich's 80-column default would cut the table's columns.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 132)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("warm-up", total=None)

        def on_progress(done: int, total: int, description: str) -> None:
            progress.update(task, completed=done, total=total, description=description)

        document = benchmark(target, draft, prompts, settings, on_progress=on_progress, **kwargs)
    render(document, console)  # the tables first: they survive a failure to write the files
    json_path = save_json(document, out)
    png_path = save_plot(document, out)
    console.print(f"wrote {json_path} and {png_path}")
    print(summary_line(document, out), flush=True)
    return 0


def _vocab_size(draft) -> int | None:
    vocab = draft.vocab
    return None if vocab is None else int(vocab.numel())


def _encode(target, messages) -> list[int]:
    # A lone user turn goes in as text, so a target without a chat template still gets plain tokenisation.
    if len(messages) == 1 and messages[0]["role"] == "user":
        return encode(target, messages[0]["content"])
    return encode(target, list(messages))


def _target_gguf(name) -> Path | None:
    """The GGUF file the target loads from, for llama.cpp: the embedded target's; None for any other target."""
    return embedded_gguf_path() if name in (None, EMBEDDED_TARGET) else None


def _draft_folder(path) -> Path | None:
    """The draft's checkpoint folder, for the reference runtime; None for an in-memory untrained draft."""
    folder = Path(path) if path else DEFAULT_DRAFT
    return folder if (folder / "config.json").is_file() else None
