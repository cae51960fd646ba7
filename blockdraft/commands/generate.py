"""`blockdraft generate`: stream one completion, or decode several prompts as one batch; --baseline / --compare
for the target alone; --temperature and the filters for exact sampling."""

from __future__ import annotations

import secrets
import sys
import time
from functools import reduce
from pathlib import Path

import torch
from rich.console import Console

from ..api import encode, load_draft
from ..decode.generate import stream
from ..decode.selection import SAMPLERS, Selector, is_coupled
from ..decode.ties import Split, first_split, is_rounding
from ..errors import InputError
from ..hardware import describe_line
from ..io.targets import load_target, parse_dtype
from ..metrics import AcceptanceStats
from ..prompts.files import read_prompt_file
from ..sampling import SamplingParams
from ..textstream import TextStream
from .common import add_model_arguments, add_sampling_arguments, context_window

console = Console(stderr=True, highlight=False)


DEFAULT_PROMPT = "Write a Python function that checks whether a string is a palindrome."


def add_arguments(parser) -> None:
    parser.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt text; several prompts run as one batch")
    parser.add_argument("--prompt-file", type=Path, help="read one prompt from this file (the whole file)")
    parser.add_argument("--prompts-file", type=Path,
                        help='one prompt per line: .txt plain lines, or .jsonl {"prompt": ...} / {"messages": ...}')
    parser.add_argument("--no-chat-template", action="store_true", help="tokenise the prompt as plain text")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=None, help="K (default: the draft's trained block size)")
    parser.add_argument("--adaptive", choices=("auto", "on", "off"), default="auto",
                        help="verify per step the number of proposals that pays best, down to none (same output, "
                             "never much slower than the target alone); auto: on unless sampling with --seed (so "
                             "that a seed reproduces its text)")
    parser.add_argument("--lookup", choices=("auto", "on", "off"), default="auto",
                        help="let a step verify a continuation of an earlier occurrence of the last tokens (prompt "
                             "lookup): grafted onto the token tree, or instead of the draft's block without trees, "
                             "when it pays (same output); auto: on when --adaptive is")
    parser.add_argument("--tree", choices=("auto", "on", "off"), default="auto",
                        help="verify the draft's likeliest alternatives per slot too, as a token tree in one target "
                             "forward (same output; sampling stays exact); auto: on")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--baseline", action="store_true", help="run the target alone")
    mode.add_argument("--compare", action="store_true", help="run the target alone and speculative, same process")
    sampling = add_sampling_arguments(parser, "exact: the output follows the target's own distribution", None,
                                      "prompt i uses seed + i (default: a random seed)")
    sampling.add_argument("--sampler", choices=SAMPLERS, default="auto",
                          help="coupled: each position's token is argmax(log p + g), Gumbel noise g keyed by the "
                               "seed and the position, the draft guessing with the same noise, so a seed gives the "
                               "target-alone sample of that seed (--compare shows identical outputs in float32); "
                               "rejection: the draft samples and p tests its guesses; auto: coupled with --seed")
    sampling.add_argument("--draft-argmax", action="store_true",
                          help="propose the draft's argmax instead of sampling it (rejection sampler; still exact)")
    add_model_arguments(parser)


def run(args) -> int:
    prompts = _read_prompts(args, DEFAULT_PROMPT)
    sampling = _sampling(args)  # bad values fail here, before minutes of loading
    window = context_window(args)
    dtype = parse_dtype(args.dtype, args.device)
    if args.max_new_tokens <= 0:
        raise InputError(f"`--max-new-tokens` must be positive, got {args.max_new_tokens}")
    with console.status("loading target and draft"):
        target = load_target(args.target, dtype=dtype, device=args.device)
        draft = None if args.baseline else load_draft(args.draft, target, full_vocab=args.full_vocab,
                                                          context_window=window)
    if draft is not None and not getattr(draft, "trained", True):
        console.print("[yellow]note: no trained draft is shipped yet; using an UNTRAINED draft "
                      "(output is exact, acceptance is near 1)[/yellow]")
    ids = [encode(target, p, chat=not args.no_chat_template) for p in prompts]
    block = args.block_size if args.block_size is not None else (
        draft.config.block_size if draft is not None else None)
    hardware = describe_line(args.device, dtype)
    adaptive, lookup, tree = decode_modes(args.adaptive, args.lookup, args.tree, sampling.greedy,
                                          seeded=args.seed is not None)
    coupled = is_coupled(args.sampler, sampling.greedy, seeded=args.seed is not None)
    decode = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, draft_argmax=args.draft_argmax,
                  adaptive=adaptive, lookup=lookup, tree=tree, coupled=coupled)
    single = len(ids) == 1
    if not sampling.greedy:
        rows = "" if single else f" (prompt i uses seed {sampling.seed} + i)"
        how = ", coupled (the seed's target-alone sample)" if coupled else ", rejection"
        timing = "; widths adapt to timing, so pass --seed to reproduce a text" if adaptive and not coupled else ""
        print(f"sampling: {_describe(sampling)}, seed {sampling.seed}{rows}{how}{timing}")
    if args.compare:
        _warm_up(target, draft, ids, block, tree)
        base_tokens, _, base = _run(target, None, ids, None, **decode)
        spec_tokens, spec_rows, spec = _run(target, draft, ids, block, echo=single, **decode)
        if not single:
            _print_rows(target, prompts, spec_tokens, spec_rows, block)
        print(_summary("target alone", base, None, hardware, len(ids)))
        print(_summary("speculative", spec, block, hardware, len(ids)))
        ratio = spec.tokens_per_second / base.tokens_per_second if base.tokens_per_second else float("nan")
        exact = dtype == torch.float32
        bug = False
        if not sampling.greedy and not coupled:  # exact samples of different draws: only their laws agree
            same = "not compared: sampled by rejection; --seed or --sampler coupled draws the same sample"
        elif spec_tokens == base_tokens:
            same = "identical"
        else:
            split = _split(target, ids, base_tokens, spec_tokens, sampling, coupled)
            bug = split is None or (exact and not is_rounding(split, dtype))
            same = _describe_split(split, dtype, bug)
        modes = (", adaptive" if adaptive else "") + (", lookup" if lookup else "") + (", tree" if tree else "")
        print(f"speedup {ratio:.2f}x  (outputs {same}; K={block}{modes}, "
              f"{spec.new_tokens} new tokens, {hardware})")
        return 1 if bug else 0
    tokens, rows, stats = _run(target, draft, ids, block, echo=single, **decode)
    if not single:
        _print_rows(target, prompts, tokens, rows, block if draft is not None else None)
    print(_summary("target alone" if draft is None else "speculative", stats, block, hardware, len(ids)))
    return 0


def _split(target, ids, base_tokens, spec_tokens, sampling: SamplingParams, coupled: bool) -> Split | None:
    """Where the runs first differ and the target's margin there (decode/ties.py), scored as the target picks."""
    if sampling.greedy:
        return first_split(target, ids, base_tokens, spec_tokens)
    selector = Selector(sampling, num_rows=len(ids), coupled=coupled)  # the runs' own row seeds

    def pick_scores(row: int, position: int, logits):
        where = torch.tensor([[position]], device=logits.device)
        return selector.pick_scores(logits[None, None], torch.tensor([row]), where)[0, 0]

    return first_split(target, ids, base_tokens, spec_tokens, pick_scores)


def _describe_split(split: Split | None, dtype, bug: bool) -> str:
    if split is None:  # equal where both ran, but one ran longer: a stop or budget handled differently
        return "DIFFERENT in length only (a bug: please report it with this command)"
    where = (f"prompt {split.row + 1}, new token {split.index}: {split.base_token} alone, {split.other_token} "
             f"speculative, the target's margin {abs(split.margin):.3g}")
    if bug:
        return f"DIFFERENT in float32 beyond rounding at {where} (a bug: please report it with this command)"
    if dtype == torch.float32:
        return f"differ at a near-tie ({where}: within float32 rounding of a K-row verify against one-row steps)"
    # A K-token verify and a one-token step round differently in 16-bit floats, so near-tie picks can flip; a
    # sample meets near-ties far more often than greedy decoding does.
    return f"differ at {where} ({dtype_name(dtype)} rounding of near-ties; --dtype float32 checks the margin)"


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _read_prompts(args, default_prompt: str) -> list:
    """Positional prompts, then --prompt-file (one prompt), then --prompts-file (one per line), in that order."""
    prompts: list = list(args.prompts)
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise InputError(f"--prompt-file {args.prompt_file} does not exist; pass a readable text file")
        prompts.append(args.prompt_file.read_text())
    if args.prompts_file is not None:
        # Errors name the file and line (PromptDataError); a one-turn prompt stays text so --no-chat-template works.
        read = read_prompt_file(str(args.prompts_file))
        if not read:
            raise InputError(f"--prompts-file {args.prompts_file} holds no prompts; write one prompt per line")
        for p in read:
            one_turn = len(p.messages) == 1 and p.messages[0]["role"] == "user"
            prompts.append(p.messages[0]["content"] if one_turn else list(p.messages))
    return prompts or [default_prompt]


def _sampling(args) -> SamplingParams:
    """SamplingParams from the flags; a random seed is drawn here so that it can be printed and reused."""
    seed = args.seed if args.seed is not None or args.temperature == 0 else secrets.randbits(31)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              min_p=args.min_p, seed=seed)
    ignored = [flag for flag, on in [("--top-p", args.top_p != 1.0), ("--top-k", args.top_k != 0),
                                     ("--min-p", args.min_p != 0.0), ("--seed", args.seed is not None),
                                     ("--draft-argmax", args.draft_argmax),
                                     ("--sampler", args.sampler != "auto")] if on]
    if sampling.greedy and ignored:
        console.print(f"[yellow]note: {', '.join(ignored)} ignored at temperature 0 (greedy); "
                      "pass --temperature to sample[/yellow]")
    elif args.draft_argmax and is_coupled(args.sampler, sampling.greedy, seeded=args.seed is not None):
        console.print("[yellow]note: --draft-argmax applies to the rejection sampler only; a coupled sample's "
                      "draft guesses argmax(log q + g) anyway[/yellow]")
    return sampling


def _describe(sampling: SamplingParams) -> str:
    parts = [f"temperature {sampling.temperature:g}"]
    parts += [f"top_k {sampling.top_k}"] if sampling.top_k else []
    parts += [f"top_p {sampling.top_p:g}"] if sampling.top_p < 1 else []
    parts += [f"min_p {sampling.min_p:g}"] if sampling.min_p > 0 else []
    return ", ".join(parts)


def decode_modes(adaptive: str, lookup: str, tree: str, greedy: bool, seeded: bool) -> tuple[bool, bool, bool]:
    """(adaptive, lookup, tree) from the flags' on/off/auto, for greedy decoding or sampling with or without a
    `--seed` from the user.

    auto: token trees always, adaptive widths (and lookups grafted on) whenever no seed has to reproduce a text:
    greedy decoding, or sampling without `--seed`. Widths chosen from wall-clock times make a sampled text depend
    on timing (still distributed exactly as the target's), so a seeded sample keeps one fixed tree of K nodes.
    With the shipped draft at temperature 0.7 (8 HumanEval and 8 MT-Bench prompts, 96 tokens, bf16, 2-core EPYC,
    median against the target alone sampling in the same process), the former default, a chain of K slots, ran
    at 0.99x and 0.86x, a fixed tree at 1.35x and 0.98x, adaptive trees with lookups at 1.64x and 1.04x. A draft
    whose q is close to p may accept more as a chain (rejection sampling takes p's whole overlap with q, a tree
    of point masses only p's mass on its guesses): compare with `--tree off`."""
    adapts = adaptive == "on" or (adaptive == "auto" and (greedy or not seeded))
    return adapts, lookup == "on" or (lookup == "auto" and adapts), tree != "off"


def _warm_up(target, draft, ids, block, tree: bool) -> None:
    """One short run of each at the batch's shape so that neither timed run pays first-call allocation costs."""
    for d in (None, draft):
        for _ in stream(target, d, ids, max_new_tokens=4, block_size=block if d is not None else None, tree=tree):
            pass


def _run(target, draft, ids, block, *, max_new_tokens, sampling, draft_argmax, adaptive, lookup, tree,
         coupled: bool = False, echo: bool = False):
    """Decode all prompts as one batch -> (tokens per row, stats per row, batch stats).

    The batch stats pool every row's tau and divide all new tokens by the one wall time: batch throughput.
    """
    K = block or 1
    stats = [AcceptanceStats(K) for _ in ids]
    tokens: list[list[int]] = [[] for _ in ids]
    text = TextStream(target.tokenizer) if echo else None
    selector = Selector(sampling, num_rows=len(ids), draft_argmax=draft_argmax, coupled=coupled)
    start = time.perf_counter()
    for event in stream(target, draft, ids, max_new_tokens=max_new_tokens, block_size=block, selector=selector,
                        stats=stats, adaptive=adaptive, lookup=lookup, tree=tree):
        tokens[event.row].extend(event.tokens)
        if text is not None:
            sys.stdout.write(text.push(event.tokens))
            sys.stdout.flush()
    if target.device.type == "cuda":
        torch.cuda.synchronize(target.device)
    seconds = time.perf_counter() - start
    for s, t in zip(stats, tokens):
        s.seconds, s.new_tokens = seconds, len(t)
    if text is not None:
        sys.stdout.write(text.flush() + "\n")
    batch = reduce(AcceptanceStats.merge, stats)
    batch.seconds = seconds  # merge adds the rows' times, but the rows ran together
    return tokens, stats, batch


def _print_rows(target, prompts, tokens, stats, block) -> None:
    """Each completion under a label naming its prompt, then one line per row with its own tau."""
    for i, (prompt, row) in enumerate(zip(prompts, tokens)):
        label = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        first_line = label.strip().splitlines()[0] if label.strip() else ""
        print(f"=== [{i}] {first_line[:70]}")
        print(target.tokenizer.decode(row, skip_special_tokens=True))
    for i, s in enumerate(stats):
        line = f"[row {i}] {s.new_tokens} tokens"
        if block:
            line += f", tau {s.mean_tau:.2f} (histogram {s.histogram})"
        print(line)


def _summary(label: str, stats: AcceptanceStats, block, hardware: str, rows: int = 1) -> str:
    batch = f" batch of {rows}:" if rows > 1 else ""
    line = f"[{label}]{batch} {stats.new_tokens} tokens, {stats.tokens_per_second:.1f} tok/s"
    if block:
        line += f", tau {stats.mean_tau:.2f} (K={block}, histogram {stats.histogram})"
        if stats.plain_steps or stats.lookup_steps:
            drafted = stats.steps - stats.plain_steps - stats.lookup_steps
            looked = f", {stats.lookup_steps} lookup" if stats.lookup_steps else ""
            line += f", adaptive: {stats.plain_steps} of {stats.steps} steps plain{looked}, {drafted} drafted"
    return f"{line} | {hardware}"
