"""`blockdraft serve`: the OpenAI-compatible server (blockdraft/server) on uvicorn, loopback by default."""

from __future__ import annotations

import os
from dataclasses import replace

from rich.console import Console

from ..decode.options import PRESETS, DecodeOptions
from ..errors import ConfigError, InputError
from ..threads import on_passing_thread
from .common import add_model_arguments, check_port_free, context_window, prepare

console = Console(stderr=True, highlight=False)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--no-spec", action="store_true", help="serve the target alone, without a draft")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    parser.add_argument("--api-key", default=os.environ.get("BLOCKDRAFT_API_KEY"),
                        help="require `Authorization: Bearer KEY` on /v1 routes (default: $BLOCKDRAFT_API_KEY)")
    parser.add_argument("--fixed-block", action="store_true",
                        help="verify the draft's full block at every step (default: token trees; greedy requests "
                             "and sampled ones without a seed adapt the number of nodes verified, down to none when "
                             "drafts miss, with prompt-lookup runs grafted on; seeded samples keep a tree of K nodes)")
    parser.add_argument("--max-batch", type=int, default=8, help="most requests decoded together in one batch")
    parser.add_argument("--max-tokens-limit", type=int, default=4096, help="largest max_tokens a request may ask")
    parser.add_argument("--max-queue", type=int, default=64,
                        help="most requests waiting for a row; past it a request gets 429 with Retry-After")
    parser.add_argument("--request-timeout", type=float, default=None, metavar="SECONDS",
                        help="end a request not finished within this many seconds, queueing included (504, or a "
                             "final error event when streaming) and free its row (default: no limit)")
    parser.add_argument("--shutdown-grace", type=float, default=30.0, metavar="SECONDS",
                        help="on SIGTERM or Ctrl-C, refuse new requests (503) and let running ones finish for up "
                             "to this long before ending them; then exit 0 (default: 30)")
    parser.add_argument("--measure-costs", action="store_true",
                        help="measure the step costs that price adaptive widths again while warming, replacing the "
                             "cached ones (do this once after a first start on a busy machine)")


def run(args) -> int:
    try:
        from ..server import create_app
        from ..server.shutdown import serve
    except ImportError as error:
        raise ConfigError(f"`blockdraft serve` needs the serve extra ({error.name} is missing); "
                          "run `pip install 'blockdraft[serve]'`") from error
    from ..api import load_draft
    from ..io.targets import load_target

    if not 0 < args.port < 65536:
        raise InputError(f"`--port` must be in 1..65535, got {args.port}; pick a free port such as 8000")
    if not args.shutdown_grace >= 0:
        raise InputError(f"`--shutdown-grace` must be 0 or more seconds, got {args.shutdown_grace}; pass e.g. 30")
    window = context_window(args)
    check_port_free(args.host, args.port)
    prepare(args)
    if args.host not in LOOPBACK and not args.api_key:
        console.print(f"[yellow]warning: binding {args.host} without --api-key: anyone who can reach this "
                      "address can use the model[/yellow]")

    def load():  # on a passing thread: this one serves HTTP and must start no OpenMP team (threads.py)
        target = load_target(args.target, dtype=args.dtype, device=args.device, weights=args.weights)
        draft = None if args.no_spec else load_draft(args.draft, target, full_vocab=args.full_vocab,
                                                     ngrams=not args.no_ngrams)
        return target, draft

    with console.status("loading target and draft"):
        target, draft = on_passing_thread(load)
    if draft is not None and not draft.trained:
        console.print("[yellow]note: no trained draft is shipped yet; serving with an UNTRAINED draft "
                      "(output is exact, acceptance is near 1)[/yellow]")
    app = create_app(target, draft, api_key=args.api_key, max_batch=args.max_batch,
                     max_tokens_limit=args.max_tokens_limit, max_queue=args.max_queue,
                     request_timeout=args.request_timeout, measure_costs=args.measure_costs,
                     options=replace(PRESETS["chain"] if args.fixed_block else DecodeOptions(), window=window))
    mode = "target alone" if draft is None else f"speculative, K={draft.config.block_size}"
    console.print(f"serving {target.name or 'the target'} ({mode}) on http://{args.host}:{args.port}/v1; step costs "
                  "are measured in the background on a first start (once per machine, then cached): GET /health "
                  "says \"warming\" until requests are served")
    serve(app, host=args.host, port=args.port, grace=args.shutdown_grace)
    return 0
