"""Batch-8 speculative decoding against batch-8 target-only decoding, greedy, in one process.

    python benchmarks/batch.py [--max-new-tokens 128] [--rounds 3] [--block-size K] [--dtype auto] [--adaptive]

The embedded target (SmolLM2-135M-Instruct) and its shipped draft decode the first 8 MT-Bench prompts as one
ragged batch (built-in prompts when the prompt package is not installed). After one warm-up of each mode the
timed runs alternate, target alone then speculative, so a change in the machine's load hits both alike.
Throughput is all rows' new tokens over the batch's wall time. Prints a table and ends stdout with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import blockdraft
from blockdraft.api import encode
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.options import DecodeOptions
from blockdraft.hardware import describe_line
from blockdraft.io.targets import parse_dtype
from blockdraft.metrics import AcceptanceStats
from blockdraft.prompts import PromptDataError, load_prompts

BATCH = 8
FALLBACK_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in three sentences why the sky is blue.",
    "Give me a short recipe for pancakes.",
    "What are the main differences between a list and a tuple in Python?",
    "Write a haiku about autumn leaves.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "How do I reverse a linked list? Show code.",
    "List five tips for a productive morning.",
]


def batch_prompts(target) -> tuple[str, list[list[int]]]:
    """(prompt set name, token ids of BATCH prompts)."""
    try:
        prompts = load_prompts("mt-bench", limit=BATCH)
        return "mt-bench", [encode(target, list(p.messages)) for p in prompts]
    except PromptDataError as error:  # the package is optional; say what was used instead
        print(f"note: mt-bench unavailable ({error}); using {BATCH} built-in prompts")
        return "built-in", [encode(target, p) for p in FALLBACK_PROMPTS]


def timed(target, draft, ids, max_new_tokens: int, block_size: int, adaptive: bool = False):
    """One batched greedy decode -> (results, seconds)."""
    start = time.perf_counter()
    options = DecodeOptions(block_size=block_size, tree=False, adaptive=adaptive, lookup=False)
    results = Decoder(target, draft, options).generate(ids, max_new_tokens=max_new_tokens)
    if target.device.type == "cuda":
        torch.cuda.synchronize()
    return results, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of each mode, interleaved")
    parser.add_argument("--block-size", type=int, default=None, help="K (default: the draft's trained block size)")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 where native, else float32), bfloat16, float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--adaptive", action="store_true", help="speculative rows use adaptive verify widths")
    args = parser.parse_args()

    args.dtype = str(parse_dtype(args.dtype, args.device)).removeprefix("torch.")
    target = blockdraft.load_target(dtype=args.dtype, device=args.device)
    draft = blockdraft.load_draft(target=target)
    K = DecodeOptions(block_size=args.block_size).block_size_of(draft.config.block_size)
    prompt_set, ids = batch_prompts(target)
    for d in (None, draft):  # warm-up: first-call allocations are not part of either number
        timed(target, d, ids, min(8, args.max_new_tokens), K)

    seconds = {"target alone": 0.0, "speculative": 0.0}
    tokens = {"target alone": 0, "speculative": 0}
    identical = True
    for _ in range(args.rounds):
        base, base_s = timed(target, None, ids, args.max_new_tokens, K)
        spec, spec_s = timed(target, draft, ids, args.max_new_tokens, K, args.adaptive)
        seconds["target alone"] += base_s
        seconds["speculative"] += spec_s
        tokens["target alone"] += sum(len(r.tokens) for r in base)
        tokens["speculative"] += sum(len(r.tokens) for r in spec)
        # Greedy is exact in float32; in bfloat16 a K-token verify can round differently from 1-token steps.
        identical &= all(b.tokens == s.tokens for b, s in zip(base, spec))
    speed = {mode: tokens[mode] / seconds[mode] for mode in seconds}
    ratio = speed["speculative"] / speed["target alone"]
    rows = [r.stats for r in spec]  # greedy: every round gives the same tokens and taus
    pooled = rows[0]
    for s in rows[1:]:
        pooled = pooled.merge(s)
    hardware = describe_line(args.device, parse_dtype(args.dtype))
    print_table(hardware, args, prompt_set, K, draft, seconds, tokens, speed, ratio, rows, pooled, identical)
    print(json.dumps({
        "bench": "batch", "hardware": hardware, "dtype": args.dtype, "prompt_set": prompt_set, "batch": len(ids),
        "block_size": K, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "adaptive": args.adaptive,
        "draft_trained": bool(getattr(draft, "trained", True)),
        "target_alone_tokens_per_second": round(speed["target alone"], 3),
        "speculative_tokens_per_second": round(speed["speculative"], 3),
        "ratio": round(ratio, 4), "mean_tau": round(pooled.mean_tau, 4), "tau_histogram": pooled.histogram,
        "tau_per_row": [round(s.mean_tau, 4) for s in rows], "outputs_identical": identical,
    }))


def print_table(hardware, args, prompt_set, K, draft, seconds, tokens, speed, ratio, rows, pooled: AcceptanceStats,
                identical: bool) -> None:
    trained = "" if getattr(draft, "trained", True) else " (UNTRAINED: no trained draft shipped, tau near 1)"
    print(f"hardware        {hardware}")
    print(f"dtype           {args.dtype}")
    print(f"prompt set      {prompt_set}, batch {len(rows)}, greedy")
    print(f"K               {K}{trained}")
    print(f"max_new_tokens  {args.max_new_tokens}")
    print(f"rounds          {args.rounds} of each, interleaved, after one warm-up")
    print()
    print(f"{'mode':<14}{'tokens':>8}{'seconds':>10}{'tok/s':>10}")
    for mode in seconds:
        print(f"{mode:<14}{tokens[mode]:>8}{seconds[mode]:>10.2f}{speed[mode]:>10.1f}")
    # Top-2 logits of SmolLM2 can sit closer than one bfloat16 step (0.125 near 30): a flip there is rounding.
    same = "identical" if identical else "differ; exact only in float32, bfloat16 near-ties flip"
    print(f"ratio           {ratio:.2f}x  (outputs {same})")
    print(f"mean tau        {pooled.mean_tau:.2f}  histogram over 1..{K}: {pooled.histogram}")
    print("tau per row     " + "  ".join(f"[{i}] {s.mean_tau:.2f}" for i, s in enumerate(rows)))


if __name__ == "__main__":
    main()
