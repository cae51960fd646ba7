"""`blockdraft bench serve`: `blockdraft serve` under load, over a sweep of concurrency levels or request rates.

Without --url it starts two servers on free loopback ports, the target alone (`--no-spec`) and the default mode,
loads them interleaved point by point and stops them at the end; with --url it loads that one server. Prints the
table, writes OUT/bench-serve.json and OUT/bench-serve.png (and the started servers' logs), and ends stdout with
one JSON line. The terms (TTFT, ITL, TPOT, per-user and total tok/s) are defined in blockdraft/bench/serve_stats.py.
"""

from __future__ import annotations

import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import ConfigError, InputError
from ..prompts import benchmark_set_names, load_prompts
from .common import add_model_arguments, layer_ids, prepare, refuse_training_sets, set_compute, writable_folder

DEFAULT_CONCURRENCY = "1,2,4,8,16"
SERVE_MAX_BATCH = 8  # `blockdraft serve`'s own default
MIN_REQUESTS = 8  # per point: fewer leave p90 a guess
RATE_SECONDS = 10  # at a rate R, the default requests per point arrive over about this many seconds


def add_arguments(parser) -> None:
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", default=None, metavar="C",
                      help=f"comma-separated concurrency levels, one point each: c clients, each sending its next "
                           f"request when its last one ends (default: {DEFAULT_CONCURRENCY})")
    load.add_argument("--request-rate", default=None, metavar="R",
                      help="comma-separated request rates per second, one point each: Poisson arrivals (a seeded "
                           "schedule), however many requests are running; instead of --concurrency")
    parser.add_argument("--url", default=None,
                        help="load this running server only (e.g. http://127.0.0.1:8000); default: start the target "
                             "alone and the default mode here, on free loopback ports")
    parser.add_argument("--api-key", default=os.environ.get("BLOCKDRAFT_API_KEY"),
                        help="the --url server's key (default: $BLOCKDRAFT_API_KEY)")
    sets = ", ".join(benchmark_set_names())
    parser.add_argument("--prompts", default="mt-bench", help=f"a benchmark set ({sets}) or a .jsonl/.txt file")
    parser.add_argument("--limit", type=int, default=10, help="use the first N prompts of the set, cycled")
    parser.add_argument("--max-tokens", type=int, default=128, help="max_tokens of every request (greedy)")
    parser.add_argument("--requests-per-point", type=int, default=None, metavar="M",
                        help=f"requests each point sends to each server (default: max({MIN_REQUESTS}, 2c) at "
                             f"concurrency c, max({MIN_REQUESTS}, {RATE_SECONDS}R) at rate R)")
    parser.add_argument("--repeats", type=int, default=1, metavar="R",
                        help="rounds of every point and mode, interleaved; reported as medians with their min-max "
                             "range (one point's rounds differ by a few %%: use 3 or more to compare modes)")
    parser.add_argument("--time-limit", type=float, default=300.0, metavar="SECONDS",
                        help="most seconds a point's round runs on one server; requests still running then are cancelled "
                             "and the point is reported as cut short")
    parser.add_argument("--out", type=Path, default=Path("bench-serve-out"),
                        help="folder for bench-serve.json, bench-serve.png and the started servers' logs")
    parser.add_argument("--startup-timeout", type=float, default=900.0, metavar="SECONDS",
                        help="wait this long for each server to be ready: /health ok and the step costs of every "
                             "batch size measured (a first start on a machine measures them for minutes)")
    servers = parser.add_argument_group("started servers", "for the servers started without --url, as "
                                        "`blockdraft serve` takes them (refused with --url)")
    add_model_arguments(servers)
    servers.add_argument("--max-batch", type=int, default=None,
                         help=f"most requests a server decodes together (default: the largest --concurrency, at "
                              f"least serve's {SERVE_MAX_BATCH}, so every point's clients decode at once)")


def run(args) -> int:
    try:
        from ..bench.serve_sweep import SweepSettings, sweep
    except ImportError as error:
        raise ConfigError(f"`blockdraft bench serve` needs the serve extra ({error.name} is missing); "
                          "run `pip install 'blockdraft[serve]'`") from error
    from ..bench.serve_report import JSON_NAME
    from ..bench.serve_plot import PNG_NAME

    for flag, value in (("--limit", args.limit), ("--max-tokens", args.max_tokens)):
        if value <= 0:
            raise InputError(f"`{flag}` must be a positive integer, got {value}")
    if args.max_batch is not None and args.max_batch < 1:
        raise InputError(f"`--max-batch` must be at least 1, got {args.max_batch}; or leave it out for the largest "
                         "--concurrency")
    if not args.time_limit > 0 or not args.startup_timeout > 0:
        raise InputError(f"`--time-limit` and `--startup-timeout` must be positive seconds, got {args.time_limit} "
                         f"and {args.startup_timeout}")
    if args.repeats < 1:
        raise InputError(f"`--repeats` must be at least 1, got {args.repeats}; pass e.g. --repeats 3")
    settings = SweepSettings(points(args), args.max_tokens, args.time_limit, args.repeats)
    if args.url is not None:
        refuse_server_options(args)
    # Prompts first: a wrong set name or a bad file line fails in milliseconds, before any server starts.
    prompts = load_prompts(args.prompts, args.limit)
    if not prompts:
        raise InputError(f"prompt source {args.prompts!r} gave no prompts; pass a set or file with prompts")
    refuse_training_sets(prompts)
    writable_folder(args.out, (JSON_NAME, PNG_NAME))
    flags = server_flags(args, settings)  # the flags as given: each server resolves auto values itself
    # Started servers: a missing draft or target folder fails here, not in a server's log; the dtype resolves as
    # theirs will. A --url server's are its own: only the thread count and device of the hardware line are ours.
    if args.url is None:
        prepare(args)
    else:
        set_compute(args)
    context = {"prompt_set": args.prompts, "prompts": len(prompts), "limit": args.limit}
    servers = _servers(args, flags, context)
    with _progress() as on_progress:
        records = sweep(servers, [p.messages for p in prompts], settings, api_key=args.api_key,
                        on_progress=on_progress)
    return report(records, settings, _hardware(args), context, args.out)


def _servers(args, flags: list[str], context: dict):
    """The servers to load: the --url one once ready, or a function that starts the two modes here for a round
    (serve_sweep.sweep's `servers`). Says which in `context`."""
    from ..bench.serve_servers import MODES, Endpoint, started_servers, wait_ready

    status = Console(stderr=True, highlight=False).status
    if args.url is not None:
        endpoint = Endpoint(urlsplit(args.url).netloc or args.url, args.url.rstrip("/"))
        with status(f"waiting for {args.url} to be ready"):
            wait_ready(endpoint, args.startup_timeout)
        context["servers"] = {endpoint.label: args.url}
        return [endpoint]
    for old in args.out.glob("server-*.log"):  # a round appends to its server's log: none of an earlier run
        old.unlink()

    def fresh(round_: int):  # serve_sweep.py rule 3: fresh servers each round, started in a rotated order
        return started_servers(MODES, flags, args.out, args.startup_timeout, round_)

    context["servers"] = {label: " ".join(["started here: blockdraft serve", *flags, *own]) for label, own in
                          MODES.items()}
    context["servers_each_round"] = "fresh, started in an order rotated by one per round"
    context |= {"target": args.target or "embedded", "draft": args.draft or "shipped"}
    return fresh


def points(args) -> tuple:
    """The sweep's points from --concurrency or --request-rate, each with its requests per point."""
    from ..bench.serve_load import Point

    if args.requests_per_point is not None and args.requests_per_point < 1:
        raise InputError(f"`--requests-per-point` must be at least 1, got {args.requests_per_point}")
    fixed = args.requests_per_point
    if args.request_rate is not None:
        rates = _rates(args.request_rate)
        return tuple(Point(fixed or max(MIN_REQUESTS, math.ceil(RATE_SECONDS * r)), rate=r) for r in rates)
    levels = layer_ids(args.concurrency or DEFAULT_CONCURRENCY, "--concurrency", "client counts such as 1,2,4,8")
    if not levels or min(levels) < 1:
        raise InputError(f"`--concurrency` must list client counts of at least 1, got {args.concurrency!r}; "
                         f"pass e.g. {DEFAULT_CONCURRENCY}")
    return tuple(Point(fixed or max(MIN_REQUESTS, 2 * c), concurrency=c) for c in levels)


def _rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        rates = []
    if not rates or not all(0 < r < math.inf for r in rates):
        raise InputError(f"`--request-rate` must list positive requests per second, got {text!r}; pass e.g. 0.5,1,2")
    return rates


def refuse_server_options(args) -> None:
    """With --url no server is started: an option for started servers would be silently ignored."""
    given = [flag for flag, on in (("--target", args.target is not None), ("--draft", args.draft is not None),
                                   ("--dtype", args.dtype != "auto"), ("--weights", args.weights != "auto"),
                                   ("--full-vocab", args.full_vocab), ("--no-ngrams", args.no_ngrams),
                                   ("--draft-window", args.draft_window is not None),
                                   ("--max-batch", args.max_batch is not None)) if on]
    if given:
        raise InputError(f"{', '.join(given)} set the servers this bench starts, but --url {args.url} is running "
                         "already with its own; drop them, or drop --url to start servers here")


def server_flags(args, settings) -> list[str]:
    """The `blockdraft serve` flags every started server shares: the model options as given, and --max-batch."""
    levels = [p.concurrency for p in settings.points if p.concurrency is not None]
    max_batch = args.max_batch or max([SERVE_MAX_BATCH, *levels])
    flags = ["--dtype", args.dtype, "--weights", args.weights, "--device", args.device, "--threads", str(args.threads),
             "--max-batch", str(max_batch), "--draft-sinks", str(args.draft_sinks)]
    for flag, value in (("--target", args.target), ("--draft", args.draft), ("--draft-window", args.draft_window)):
        if value is not None:
            flags += [flag, str(value)]
    return flags + ["--full-vocab"] * args.full_vocab + ["--no-ngrams"] * args.no_ngrams


def _hardware(args) -> dict:
    """Where the numbers were measured: this machine, with the started servers' dtype (unknown for --url)."""
    from ..hardware import describe
    from ..io.targets import parse_dtype

    if args.url is not None:
        return describe(args.device)
    return describe(args.device, parse_dtype(args.dtype, args.device), args.weights == "q4")


@contextmanager
def _progress():
    """A progress bar on stderr; yields the sweep's `on_progress(done, total, description)`."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("warm-up", total=None)
        yield lambda done, total, text: progress.update(task, completed=done, total=total or None, description=text)


def report(records: list[dict], settings, hardware: dict, context: dict, out: Path) -> int:
    """The table on stdout, the JSON and PNG in `out`, the JSON line last."""
    from ..bench.serve_plot import save_plot
    from ..bench.serve_report import build_document, render, save_json, summary_line

    document = build_document(records, settings, hardware=hardware, context=context)
    # A pipe or file gets a fixed width: rich's 80-column default would cut the table's columns.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    render(document, console)  # the table first: it survives a failure to write the files
    json_path, png_path = save_json(document, out), save_plot(document, out)
    console.print(f"wrote {json_path} and {png_path}")
    print(summary_line(document, out), flush=True)
    return 0
