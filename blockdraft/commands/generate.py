"""`blockdraft generate`: stream one completion, or decode several prompts as one batch; --baseline / --compare
for the target alone; --temperature and the filters for exact sampling."""

from __future__ import annotations

import secrets
import sys
from functools import reduce
from pathlib import Path

import torch
from rich.console import Console

from ..api import encode, load_draft
from ..decode.decoder import Decoder
from ..decode.options import resolve
from ..decode.selection import SAMPLERS, is_coupled
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
                        help="verify per step the number of proposals that pays best, down to none, priced by step "
                             "costs measured once and cached (same output, the same every run); auto: on")
    parser.add_argument("--lookup", choices=("auto", "on", "off"), default="auto",
                        help="let a step verify a continuation of an earlier occurrence of the last tokens (prompt "
                             "lookup): grafted onto the token tree, or instead of the draft's block without trees, "
                             "when it pays (same output); auto: on")
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
    options = resolve(None, block_size=args.block_size, tree=_switch(args.tree), adaptive=_switch(args.adaptive),
                      lookup=_switch(args.lookup), sampling=sampling,
                      # A seed drawn here samples as an unseeded request does: by rejection (the line printed
                      # below says how to draw the same text again).
                      sampler="rejection" if args.seed is None and args.sampler == "auto" else args.sampler,
                      draft_argmax=args.draft_argmax, window=window)
    dtype = parse_dtype(args.dtype, args.device)
    if args.max_new_tokens <= 0:
        raise InputError(f"`--max-new-tokens` must be positive, got {args.max_new_tokens}")
    with console.status("loading target and draft"):
        target = load_target(args.target, dtype=dtype, device=args.device)
        draft = None if args.baseline else load_draft(args.draft, target, full_vocab=args.full_vocab)
    if draft is not None and not draft.trained:
        console.print("[yellow]note: no trained draft is shipped yet; using an UNTRAINED draft "
                      "(output is exact, acceptance is near 1)[/yellow]")
    ids = [encode(target, p, chat=not args.no_chat_template) for p in prompts]
    hardware = describe_line(args.device, dtype)
    spec = Decoder(target, draft, options)
    block = spec.block_size() if draft is not None else None
    single = len(ids) == 1
    if not sampling.greedy:
        rows = "" if single else f" (prompt i uses seed {sampling.seed} + i)"
        how = "coupled (the seed's target-alone sample)" if options.coupled else "rejection"
        again = f"; rerun with --seed {sampling.seed} --sampler rejection to draw it again" if args.seed is None else ""
        print(f"sampling: {_describe(sampling)}, seed {sampling.seed}{rows}, {how}{again}")
    if args.compare:
        base_decoder = Decoder(target, None, options)
        for decoder in (base_decoder, spec):  # neither timed run pays first-call costs (or measures step costs)
            decoder.generate(ids, max_new_tokens=4)
        base_tokens, _, base = _run(base_decoder, ids, args.max_new_tokens)
        spec_tokens, spec_rows, spec_stats = _run(spec, ids, args.max_new_tokens, echo=single)
        if not single:
            _print_rows(target, prompts, spec_tokens, spec_rows, block)
        print(_summary("target alone", base, None, hardware, len(ids)))
        print(_summary("speculative", spec_stats, block, hardware, len(ids)))
        ratio = spec_stats.tokens_per_second / base.tokens_per_second if base.tokens_per_second else float("nan")
        exact = dtype == torch.float32
        bug = False
        if not sampling.greedy and not options.coupled:  # exact samples of different draws: only their laws agree
            same = "not compared: sampled by rejection; --seed or --sampler coupled draws the same sample"
        elif spec_tokens == base_tokens:
            same = "identical"
        else:
            split = _split(spec, ids, base_tokens, spec_tokens)
            bug = split is None or (exact and not is_rounding(split, dtype))
            same = _describe_split(split, dtype, bug)
        print(f"speedup {ratio:.2f}x  (outputs {same}; K={block}, {options.describe()}, "
              f"{spec_stats.new_tokens} new tokens, {hardware})")
        return 1 if bug else 0
    tokens, rows, stats = _run(spec, ids, args.max_new_tokens, echo=single)
    if not single:
        _print_rows(target, prompts, tokens, rows, block)
    print(_summary("target alone" if draft is None else "speculative", stats, block, hardware, len(ids)))
    return 0


def _split(decoder: Decoder, ids, base_tokens, spec_tokens) -> Split | None:
    """Where the runs first differ and the target's margin there (decode/ties.py), scored as the target picks."""
    options = decoder.options
    if options.sampling.greedy:
        return first_split(decoder.target, ids, base_tokens, spec_tokens)
    selector = decoder.selector(len(ids), options)  # the runs' own row seeds

    def pick_scores(row: int, position: int, logits):
        where = torch.tensor([[position]], device=logits.device)
        return selector.pick_scores(logits[None, None], torch.tensor([row]), where)[0, 0]

    return first_split(decoder.target, ids, base_tokens, spec_tokens, pick_scores)


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


def _switch(flag: str) -> bool | None:
    """on/off/auto -> True/False/None (auto: the default of DecodeOptions)."""
    return {"on": True, "off": False}.get(flag)


def _run(decoder: Decoder, ids, max_new_tokens: int, echo: bool = False):
    """Decode all prompts as one batch -> (tokens per row, stats per row, batch stats).

    The batch stats pool every row's tau and divide all new tokens by the one wall time: batch throughput.
    """
    text = TextStream(decoder.target.tokenizer) if echo else None

    def show(row: int, tokens: list[int]) -> None:
        sys.stdout.write(text.push(tokens))
        sys.stdout.flush()

    results = decoder.generate(ids, max_new_tokens=max_new_tokens, on_tokens=show if echo else None)
    if text is not None:
        sys.stdout.write(text.flush() + "\n")
    stats = [r.stats for r in results]
    batch = reduce(AcceptanceStats.merge, stats)
    batch.seconds = stats[0].seconds  # merge adds the rows' times, but the rows ran together
    return [r.tokens for r in results], stats, batch


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
