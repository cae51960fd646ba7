"""How often a prompt-lookup run is right, by the suffix its occurrence shares with the context's end.

    python benchmarks/lookup_strength.py [--prompts humaneval,mt-bench] [--limit 16] [--max-new-tokens 128]
                                         [--weights q4] [--threads 2]

The embedded target alone answers each prompt greedily; then, at every answer position, the lookup's rule
(decode/lookup.py: the earlier occurrence of the context's last tokens sharing the longest suffix with it, up to
16) proposes up to 15 tokens, which are compared with what the target wrote next. Prints, per shared suffix
(2, 3, ... 8 or more tokens), how many runs there were, how often the first token was right and how many tokens
a verify would have accepted; ends stdout with one JSON line. This is what `continuation.STRENGTHS` classes runs by.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
import torch

from blockdraft.api import encode
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.continuation import MAX_NGRAM, continuation_start
from blockdraft.hardware import describe_line
from blockdraft.io.targets import load_target
from blockdraft.prompts import load_prompts

RUN = 15  # tokens a run proposes: a lookup block's 2K - 1 at K = 8


def accepted(run: np.ndarray, truth: np.ndarray) -> int:
    """How many of a run's tokens equal what followed, before the first that does not."""
    n = min(len(run), len(truth))
    differs = np.flatnonzero(run[:n] != truth[:n])
    return int(differs[0]) if differs.size else n


def runs_by_strength(prompt: list[int], answer: list[int], longest: int = 8) -> dict[int, list[int]]:
    """{shared suffix (capped at `longest`): [accepted tokens of each run]} over every answer position."""
    full = np.array(prompt + answer)
    found: dict[int, list[int]] = defaultdict(list)
    for end in range(len(prompt), len(full) - 1):
        start, shared = continuation_start(full[:end], MAX_NGRAM, 2)
        if start is not None:
            run = full[start : min(start + RUN, end)]
            found[min(shared, longest)].append(accepted(run, full[end : end + len(run)]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", default="humaneval,mt-bench")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--weights", default="q4")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(weights=args.weights)
    hardware = describe_line("cpu", target.dtype, quantized=args.weights == "q4")
    print(hardware, f"| greedy answers of {args.max_new_tokens} tokens")
    table = {}
    for name in args.prompts.split(","):
        prompts = [encode(target, p.messages) for p in load_prompts(name, limit=args.limit)]
        answers = Decoder(target, None).generate(prompts, max_new_tokens=args.max_new_tokens, stop_token_ids=[])
        pooled: dict[int, list[int]] = defaultdict(list)
        for prompt, answer in zip(prompts, answers):
            for shared, counts in runs_by_strength(prompt, answer.tokens).items():
                pooled[shared] += counts
        for shared in sorted(pooled):
            counts = np.array(pooled[shared])
            row = dict(runs=len(counts), first_right=round(float((counts > 0).mean()), 3),
                       mean_accepted=round(float(counts.mean()), 2))
            table[f"{name}/{shared}{'+' if shared == 8 else ''}"] = row
            print(f"{name:10s} shared {shared}{'+' if shared == 8 else ' '}  runs {row['runs']:4d}  first token right "
                  f"{row['first_right']:.2f}  mean accepted {row['mean_accepted']:.2f}")
    print(json.dumps(table))


if __name__ == "__main__":
    main()
