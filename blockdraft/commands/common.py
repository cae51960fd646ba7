"""Arguments shared by several commands."""

from __future__ import annotations


def add_model_arguments(parser) -> None:
    parser.add_argument("--target", default=None, help="HF folder or hub id (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default=None, help="draft checkpoint folder (default: the shipped draft)")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on GPUs and on CPUs with native bf16, "
                        "else float32), bfloat16, float32 (exact), float16")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--full-vocab", action="store_true",
                        help="let the draft propose any token id, ignoring the draft folder's blockdraft_vocab.json")
    parser.add_argument("--draft-window", type=int, default=None, metavar="W",
                        help="bound the draft's context memory: keep the latest W positions and the first "
                             "--draft-sinks (same output; acceptance may drop at contexts past W); default: all")
    parser.add_argument("--draft-sinks", type=int, default=4, metavar="S",
                        help="first positions the draft window always keeps (default 4)")


def context_window(args):
    """The draft context window the flags ask for (decode/window.py), or None for the whole context."""
    from ..decode.window import ContextWindow

    return None if args.draft_window is None else ContextWindow(args.draft_window, args.draft_sinks)


def add_sampling_arguments(parser, description: str, seed_default: int | None, seed_help: str):
    """The sampling flags (temperature and the filters, in `SamplingParams`' order, and the seed) as one argument
    group, returned for command-specific additions."""
    group = parser.add_argument_group("sampling", description)
    group.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    group.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]; 1 is off")
    group.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens; 0 is off")
    group.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p * top probability")
    group.add_argument("--seed", type=int, default=seed_default, help=seed_help)
    return group
