"""`blockdraft` command line: parse, validate, call one library function, print. No algorithm here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import BlockdraftError

DEFAULT_PROMPT = "Write a Python function that checks whether a string is a palindrome."


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None, help="HF folder or hub id (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default=None, help="draft checkpoint folder (default: the shipped draft)")
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 (fast on CPU), float32 (exact), float16")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blockdraft", description="Exact DFlash speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text, streaming, with speed and acceptance statistics")
    gen.add_argument("prompt", nargs="?", default=None, help="prompt text (or use --prompt-file)")
    gen.add_argument("--prompt-file", type=Path, help="read the prompt text from this file")
    gen.add_argument("--no-chat-template", action="store_true", help="tokenise the prompt as plain text")
    gen.add_argument("--max-new-tokens", type=int, default=256)
    gen.add_argument("--block-size", type=int, default=None, help="K (default: the draft's trained block size)")
    mode = gen.add_mutually_exclusive_group()
    mode.add_argument("--baseline", action="store_true", help="run the target alone")
    mode.add_argument("--compare", action="store_true", help="run the target alone and speculative, same process")
    _add_model_args(gen)

    inspect = sub.add_parser("inspect", help="print a draft checkpoint's config and validate it against a target")
    inspect.add_argument("checkpoint", type=Path)
    inspect.add_argument("--target", default=None, help="validate against this target (default: embedded)")
    inspect.add_argument("--strict", action="store_true", help="refuse a provenance fingerprint mismatch")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            from .commands.generate import run_generate

            return run_generate(args, DEFAULT_PROMPT)
        if args.command == "inspect":
            from .commands.inspect import run_inspect

            return run_inspect(args)
    except BlockdraftError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
