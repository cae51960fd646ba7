"""The greedy screen (model/screen.py) against the whole head: the same tokens, and what it saves.

    python benchmarks/greedy_screen.py [--weights q4|bf16] [--limit 4] [--max-new-tokens 128] [--rounds 2]
                                       [--threads 2]

Where the target has a screen (a bf16 head on a CPU without native bf16), decodes the first `--limit` HumanEval
and MT-Bench prompts, greedy, one at a time: the target alone with its whole head (the oracle), the target alone
screened, and the default mode (the shipped draft) with and without the screen. Prints how many answers equal the
oracle's, then tokens/s of each, the four alternated `--rounds` times in one process (each cost table measured
once beforehand), with the hardware line. Ends stdout with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from blockdraft.api import encode, load_draft
from blockdraft.decode.decoder import Decoder
from blockdraft.hardware import describe_line
from blockdraft.io.targets import load_target
from blockdraft.prompts import load_prompts


def decode(decoder: Decoder, prompts: list[list[int]], most: int) -> tuple[list[list[int]], float]:
    """Each prompt's tokens, decoded alone, and the seconds all took."""
    answers, start = [], time.perf_counter()
    for prompt in prompts:
        answers.append([t for event in decoder.stream([prompt], max_new_tokens=most, stop_token_ids=[])
                        for t in event.tokens])
    return answers, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="q4", choices=["q4", "bf16"])
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(weights=args.weights)
    if not target.screened:
        raise SystemExit("this target has no greedy screen here (a bf16 head on a CPU without native bf16 has one)")
    screen = target._screen
    prompts = [encode(target, list(p.messages)) for name in ("humaneval", "mt-bench")
               for p in load_prompts(name, limit=args.limit)]
    draft = load_draft(target=target)
    decoders = {"alone": Decoder(target, None), "default": Decoder(target, draft)}
    runs = [(mode, screened) for mode in decoders for screened in (False, True)]

    def run(mode: str, screened: bool):
        target._screen = screen if screened else None  # the cost tables are keyed by it: each its own
        return decode(decoders[mode], prompts, args.max_new_tokens)

    answers = {key: run(*key)[0] for key in runs}  # also measures each cost table once
    oracle = answers[("alone", False)]
    equal = {f"{mode}{' screened' if screened else ''}": sum(a == b for a, b in zip(answers[(mode, screened)], oracle))
             for mode, screened in runs}
    seconds: dict[tuple, list[float]] = {key: [] for key in runs}
    for _ in range(args.rounds):
        for key in runs:
            seconds[key].append(run(*key)[1])
    tokens = sum(map(len, oracle))
    speed = {f"{mode}{' screened' if screened else ''}": tokens / statistics.median(seconds[(mode, screened)])
             for mode, screened in runs}
    hardware = describe_line("cpu", target.dtype, quantized=args.weights == "q4")
    print(f"greedy, {len(prompts)} prompts (HumanEval and MT-Bench, {args.limit} each), {args.max_new_tokens} new "
          f"tokens, one at a time, --weights {args.weights}, the shipped draft; {hardware}")
    for name in equal:
        print(f"  {name:18s} {equal[name]} of {len(prompts)} answers equal the whole head's target alone, "
              f"{speed[name]:.1f} tokens/s (median of {args.rounds})")
    print(f"  screened / whole: target alone {speed['alone screened'] / speed['alone']:.3f}x, default mode "
          f"{speed['default screened'] / speed['default']:.3f}x")
    print(json.dumps({"weights": args.weights, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                      "equal": equal, "tokens_per_second": speed, "rounds": args.rounds, "hardware": hardware}))


if __name__ == "__main__":
    main()
