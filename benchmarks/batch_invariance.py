"""Whether a request's tokens depend on the requests batched with it: each answer of a batch against its prompt alone.

    python benchmarks/batch_invariance.py [--mode alone|default] [--weights q4|bf16|fp32] [--prompts humaneval]
                                          [--requests 48] [--rows 8] [--max-new-tokens 128] [--threads 2]

The embedded target alone (or the default mode: the shipped draft's adaptive trees with prompt lookup, as `serve`
runs it) decodes `--requests` prompts twice: as a server's continuous batching does (`--rows`
rows kept busy, each finished row replaced by the next request, budgets staggered 48-128 tokens so rows join one
at a time), and each prompt on its own. Greedy; prints how many answers are equal token for token, and where the
others first part, with the hardware line and MKL's mode (mkl_mode.py); ends stdout with one JSON line.
"""

from __future__ import annotations

import argparse
import json

import torch

from blockdraft.api import encode
from blockdraft.api import load_draft
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.generate import Admission
from blockdraft.hardware import describe_line
from blockdraft.io.targets import load_target
from blockdraft.mkl_mode import strict
from blockdraft.prompts import load_prompts


def budget(index: int, most: int) -> int:
    """Staggered budgets (48, 64, ... up to `most`), so that rows finish, and others join, one at a time."""
    return min(most, 48 + 16 * (index % 6))


def batched(decoder: Decoder, prompts: list[list[int]], rows: int, most: int) -> list[list[int]]:
    """Every prompt's tokens, decoded `rows` at a time, a waiting prompt joining as soon as a row finishes."""
    waiting, order, live, tokens = list(range(rows, len(prompts))), list(range(rows)), set(range(rows)), {}

    def admit(room: int) -> list[Admission]:
        joining = []
        while waiting and len(live) + len(joining) < rows:
            index = waiting.pop(0)
            joining.append(Admission(prompts[index], budget(index, most)))
            order.append(index)
        live.update(range(len(order) - len(joining), len(order)))
        return joining

    first = [budget(i, most) for i in range(rows)]
    for event in decoder.stream(prompts[:rows], max_new_tokens=first, stop_token_ids=[], admit=admit,
                                room=max(map(len, prompts)) + most, max_rows=rows):
        tokens.setdefault(order[event.row], []).extend(event.tokens)
        if event.finish_reason is not None:
            live.discard(event.row)
    return [tokens[i] for i in range(len(prompts))]


def alone(decoder: Decoder, prompt: list[int], most: int) -> list[int]:
    out: list[int] = []
    for event in decoder.stream([prompt], max_new_tokens=most, stop_token_ids=[]):
        out.extend(event.tokens)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="alone", choices=["alone", "default"])
    parser.add_argument("--weights", default="q4", choices=["q4", "bf16", "fp32"])
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(weights=args.weights)
    prompts = [encode(target, list(p.messages)) for p in load_prompts(args.prompts, limit=args.requests)]
    decoder = Decoder(target, load_draft(target=target) if args.mode == "default" else None)
    together = batched(decoder, prompts, args.rows, args.max_new_tokens)
    parted = {}
    for index, (prompt, tokens) in enumerate(zip(prompts, together)):
        own = alone(decoder, prompt, budget(index, args.max_new_tokens))
        if own != tokens:
            parted[index] = next((k for k, (a, b) in enumerate(zip(own, tokens)) if a != b), min(len(own), len(tokens)))
    equal = len(prompts) - len(parted)
    hardware = describe_line("cpu", target.dtype, quantized=args.weights == "q4")
    print(f"{equal} of {len(prompts)} answers equal the prompt alone ({args.rows} rows kept busy, {args.prompts}, "
          f"--weights {args.weights}, budgets 48-{args.max_new_tokens} tokens, greedy, "
          f"{'target alone' if args.mode == 'alone' else 'default mode'})")
    for index, token in parted.items():
        print(f"  prompt {index}: first differs at new token {token}")
    print(f"{hardware}; MKL strict mode: {strict()}")
    print(json.dumps({"equal": equal, "requests": len(prompts), "rows": args.rows, "weights": args.weights, "mode": args.mode,
                      "prompts": args.prompts, "parted_at": parted, "mkl_strict": strict(),
                      "hardware": hardware}))


if __name__ == "__main__":
    main()
