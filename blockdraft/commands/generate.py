"""`blockdraft generate`: stream one completion, or decode several prompts as one batch; --baseline / --compare
for the target alone; --temperature and the filters for exact sampling."""

from __future__ import annotations

import sys
from functools import reduce
from pathlib import Path

import torch
from rich.console import Console

from ..api import encode, load_draft
from ..decode.decoder import Decoder
from ..decode.ties import Split, first_split, is_rounding
from ..errors import InputError
from ..hardware import describe_line
from ..io.targets import load_target, parse_dtype
from ..metrics import AcceptanceStats
from ..prompts.files import read_prompt_file
from ..textstream import TextStream
from .common import add_decode_arguments, add_model_arguments, prepare
from .decoding import decode_options, sampling_line

console = Console(stderr=True, highlight=False)


def add_arguments(parser) -> None:
    parser.add_argument("prompts", nargs="*", metavar="PROMPT",
                        help="prompt text; several prompts run as one batch; - (or none, with piped input) reads "
                             "standard input; none at a terminal asks for one")
    parser.add_argument("--prompt-file", type=Path, help="read one prompt from this file (the whole file)")
    parser.add_argument("--prompts-file", type=Path,
                        help='one prompt per line: .txt plain lines, or .jsonl {"prompt": ...} / {"messages": ...}')
    parser.add_argument("--system", default=None, help="a system message before each prompt (chat template)")
    parser.add_argument("--no-chat-template", action="store_true", help="tokenise the prompt as plain text")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--baseline", action="store_true", help="run the target alone")
    mode.add_argument("--compare", action="store_true",
                      help="run the target alone, then speculative, in this process: the speedup and whether the "
                           "outputs are the same")
    add_decode_arguments(parser)
    add_model_arguments(parser)


def run(args) -> int:
    prompts = read_prompts(args)
    options = decode_options(args, console)  # bad values fail here, before the model load
    sampling = options.sampling
    prepare(args)
    dtype = parse_dtype(args.dtype, args.device)
    with console.status("loading target and draft"):
        target = load_target(args.target, dtype=dtype, device=args.device, weights=args.weights)
        draft = None if args.baseline else load_draft(args.draft, target, full_vocab=args.full_vocab,
                                                      ngrams=not args.no_ngrams)
    if draft is not None and not draft.trained:
        console.print("[yellow]note: no trained draft is shipped yet; using an UNTRAINED draft "
                      "(output is exact, acceptance is near 1)[/yellow]")
    ids = [encode(target, p, chat=not args.no_chat_template) for p in prompts]
    hardware = describe_line(args.device, dtype, target.quantized)
    spec = Decoder(target, draft, options, measure_costs=args.measure_costs)
    with console.status("measuring step costs (once per machine, then cached)"):
        spec.costs(len(ids))
    block = spec.block_size() if draft is not None else None
    single = len(ids) == 1
    if not sampling.greedy:
        print(sampling_line(options, drawn=args.seed is None, rows=len(ids)))
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
            print(_both_texts(target.tokenizer, base_tokens, spec_tokens))
            same = _describe_split(split, dtype, bug, target.tokenizer)
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


def _describe_split(split: Split | None, dtype, bug: bool, tokenizer) -> str:
    if split is None:  # equal where both ran, but one ran longer: a stop or budget handled differently
        return "DIFFERENT in length only (a bug: please report it with this command)"
    where = (f"prompt {split.row + 1}, new token {split.index}: {_token_text(tokenizer, split.base_token)} alone, "
             f"{_token_text(tokenizer, split.other_token)} speculative, the target's margin {abs(split.margin):.3g}")
    if bug:
        return f"DIFFERENT in float32 beyond rounding at {where} (a bug: please report it with this command)"
    if dtype == torch.float32:
        return f"differ at a near-tie ({where}: within float32 rounding of a K-row verify against one-row steps)"
    # A K-token verify and a one-token step round differently in 16-bit floats, so near-tie picks can flip; a
    # sample meets near-ties far more often than greedy decoding does.
    return f"differ at {where} ({dtype_name(dtype)} rounding of near-ties; --dtype float32 checks the margin)"


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def read_prompts(args) -> list:
    """Positional prompts, then --prompt-file (one prompt), then --prompts-file (one per line); a prompt "-", or
    none at all with piped input, reads standard input; none at a terminal asks for one. --system goes before
    each. Empty prompts are refused here, before any model is loaded."""
    prompts: list = [p for p in args.prompts if p != "-"]
    if "-" in args.prompts or (not args.prompts and args.prompt_file is None and args.prompts_file is None
                               and not sys.stdin.isatty()):
        prompts.append(sys.stdin.read())
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
    if not prompts:
        prompts.append(input("prompt: "))
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str) and not prompt.strip():
            where = "" if len(prompts) == 1 else f" (prompt {i + 1})"
            raise InputError(f"the prompt is empty{where}; give some text, e.g. blockdraft generate \"Say hello\"")
    if args.system is None:
        return prompts
    if args.no_chat_template:
        raise InputError("--system needs the chat template; leave out --no-chat-template")
    system = {"role": "system", "content": args.system}
    return [[system, {"role": "user", "content": p}] if isinstance(p, str) else [system] + list(p) for p in prompts]


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
            line += f", tau {s.mean_tau:.2f} (histogram {s.histogram_text()})"
        print(line)


def _summary(label: str, stats: AcceptanceStats, block, hardware: str, rows: int = 1) -> str:
    batch = f" batch of {rows}:" if rows > 1 else ""
    line = f"[{label}]{batch} {stats.new_tokens} tokens, {stats.tokens_per_second:.1f} tok/s"
    if block:
        line += f", tau {stats.mean_tau:.2f} (K={block}, histogram {stats.histogram_text()})"
        if stats.plain_steps or stats.lookup_steps:
            drafted = stats.steps - stats.plain_steps - stats.lookup_steps
            looked = f", {stats.lookup_steps} lookup" if stats.lookup_steps else ""
            line += f", adaptive: {stats.plain_steps} of {stats.steps} steps plain{looked}, {drafted} drafted"
    return f"{line} | {hardware}"


def _token_text(tokenizer, token: int) -> str:
    """One token as the reader sees it, and its id: repr shows a space or a newline that plain text would hide."""
    return f"{tokenizer.decode([token])!r} (id {token})"


def _both_texts(tokenizer, base_tokens: list[list[int]], spec_tokens: list[list[int]]) -> str:
    """Both completions of every prompt whose runs differ, each under the run's label: the first differing
    token is easier to judge in its sentence than alone."""
    blocks = []
    for row, (base, spec) in enumerate(zip(base_tokens, spec_tokens)):
        if base != spec:
            blocks += [f"=== [target alone] prompt {row + 1}:", tokenizer.decode(base, skip_special_tokens=True),
                       f"=== [speculative] prompt {row + 1}:", tokenizer.decode(spec, skip_special_tokens=True)]
    return "\n".join(blocks)
