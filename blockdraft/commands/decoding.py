"""The decode flags of `generate` and `chat` (common.add_decode_arguments) resolved into one DecodeOptions, and the
line that tells a sampled run how to draw the same text again."""

from __future__ import annotations

import secrets

from ..decode.options import DecodeOptions, resolve
from ..errors import InputError
from ..sampling import SamplingParams
from .common import context_window


def switch(flag: str) -> bool | None:
    """on/off/auto -> True/False/None (auto: the default of DecodeOptions)."""
    return {"on": True, "off": False}.get(flag)


def decode_options(args, console) -> DecodeOptions:
    """DecodeOptions from the flags, checked before any model load. A sample without --seed gets a random seed
    drawn here, and samples by rejection as an unseeded server request does (`sampling_line` prints both)."""
    if args.max_new_tokens <= 0:
        raise InputError(f"`--max-new-tokens` must be positive, got {args.max_new_tokens}")
    options = resolve(None, block_size=args.block_size, tree=switch(args.tree), adaptive=switch(args.adaptive),
                      lookup=switch(args.lookup), drafting=switch(args.drafting), sampling=_sampling(args, console),
                      sampler="rejection" if args.seed is None and args.sampler == "auto" else args.sampler,
                      draft_argmax=args.draft_argmax, window=context_window(args))
    if options.draft_argmax and options.coupled:
        console.print("[yellow]note: --draft-argmax applies to the rejection sampler only; a coupled sample's "
                      "draft guesses argmax(log q + g) anyway[/yellow]")
    return options


def _sampling(args, console) -> SamplingParams:
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
    return sampling


def describe_sampling(sampling: SamplingParams) -> str:
    parts = [f"temperature {sampling.temperature:g}"]
    parts += [f"top_k {sampling.top_k}"] if sampling.top_k else []
    parts += [f"top_p {sampling.top_p:g}"] if sampling.top_p < 1 else []
    parts += [f"min_p {sampling.min_p:g}"] if sampling.min_p > 0 else []
    return ", ".join(parts)


def sampling_line(options: DecodeOptions, drawn: bool, rows: int = 1) -> str:
    """What a sampled run drew from; with a seed drawn for it (`drawn`), the flags that draw the same text again."""
    seed = options.sampling.seed
    each = "" if rows == 1 else f" (prompt i uses seed {seed} + i)"
    how = "coupled (the seed's target-alone sample)" if options.coupled else "rejection"
    again = f"; rerun with --seed {seed} --sampler rejection to draw it again" if drawn else ""
    return f"sampling: {describe_sampling(options.sampling)}, seed {seed}{each}, {how}{again}"
