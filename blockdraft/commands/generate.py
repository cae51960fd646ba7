"""`blockdraft generate`: stream one completion; --baseline / --compare for the target alone."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from rich.console import Console

from ..api import encode, load_draft
from ..decode.generate import stream
from ..errors import InputError
from ..hardware import describe_line
from ..io.targets import load_target, parse_dtype
from ..metrics import AcceptanceStats
from ..textstream import TextStream
from .common import add_model_arguments

console = Console(stderr=True, highlight=False)


DEFAULT_PROMPT = "Write a Python function that checks whether a string is a palindrome."


def add_arguments(parser) -> None:
    parser.add_argument("prompt", nargs="?", default=None, help="prompt text (or use --prompt-file)")
    parser.add_argument("--prompt-file", type=Path, help="read the prompt text from this file")
    parser.add_argument("--no-chat-template", action="store_true", help="tokenise the prompt as plain text")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=None, help="K (default: the draft's trained block size)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--baseline", action="store_true", help="run the target alone")
    mode.add_argument("--compare", action="store_true", help="run the target alone and speculative, same process")
    add_model_arguments(parser)


def run(args) -> int:
    prompt = _read_prompt(args, DEFAULT_PROMPT)
    dtype = parse_dtype(args.dtype)
    if args.max_new_tokens <= 0:
        raise InputError(f"`--max-new-tokens` must be positive, got {args.max_new_tokens}")
    with console.status("loading target and draft"):
        target = load_target(args.target, dtype=dtype, device=args.device)
        draft = None if args.baseline else load_draft(args.draft, target)
    if draft is not None and not getattr(draft, "trained", True):
        console.print("[yellow]note: no trained draft is shipped yet; using an UNTRAINED draft "
                      "(output is exact, acceptance is near 1)[/yellow]")
    ids = encode(target, prompt, chat=not args.no_chat_template)
    block = args.block_size or (draft.config.block_size if draft is not None else None)
    hardware = describe_line(args.device, dtype)
    if args.compare:
        _warm_up(target, draft, ids, block)
        base_tokens, base = _run(target, None, ids, args.max_new_tokens, None, echo=False)
        spec_tokens, spec = _run(target, draft, ids, args.max_new_tokens, block, echo=True, tokenizer=target.tokenizer)
        print(_summary("target alone", base, None, hardware))
        print(_summary("speculative", spec, block, hardware))
        same = "identical" if spec_tokens == base_tokens else "DIFFERENT (report this: outputs must match)"
        ratio = spec.tokens_per_second / base.tokens_per_second if base.tokens_per_second else float("nan")
        print(f"speedup {ratio:.2f}x  (outputs {same}; K={block}, {len(spec_tokens)} new tokens, {hardware})")
        return 0 if spec_tokens == base_tokens else 1
    _, stats = _run(target, draft, ids, args.max_new_tokens, block, echo=True, tokenizer=target.tokenizer)
    print(_summary("target alone" if draft is None else "speculative", stats, block, hardware))
    return 0


def _read_prompt(args, default_prompt: str) -> str:
    if args.prompt is not None and args.prompt_file is not None:
        raise InputError("give the prompt as an argument or with --prompt-file, not both")
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise InputError(f"--prompt-file {args.prompt_file} does not exist; pass a readable text file")
        return args.prompt_file.read_text()
    return default_prompt if args.prompt is None else args.prompt


def _warm_up(target, draft, ids, block) -> None:
    """One short run of each so that neither timed run pays first-call allocation costs."""
    for d in (None, draft):
        for _ in stream(target, d, [ids], max_new_tokens=4, block_size=block if d is not None else None):
            pass


def _run(target, draft, ids, max_new_tokens, block, *, echo: bool, tokenizer=None):
    K = block or 1
    stats = [AcceptanceStats(K)]
    tokens: list[int] = []
    text = TextStream(tokenizer) if echo else None
    start = time.perf_counter()
    for event in stream(target, draft, [ids], max_new_tokens=max_new_tokens, block_size=block, stats=stats):
        tokens.extend(event.tokens)
        if text is not None:
            sys.stdout.write(text.push(event.tokens))
            sys.stdout.flush()
    if target.device.type == "cuda":
        torch.cuda.synchronize()
    stats[0].seconds, stats[0].new_tokens = time.perf_counter() - start, len(tokens)
    if text is not None:
        sys.stdout.write(text.flush() + "\n")
    return tokens, stats[0]


def _summary(label: str, stats: AcceptanceStats, block, hardware: str) -> str:
    line = f"[{label}] {stats.new_tokens} tokens, {stats.tokens_per_second:.1f} tok/s"
    if block:
        line += f", tau {stats.mean_tau:.2f} (K={block}, histogram {stats.histogram})"
    return f"{line} | {hardware}"
