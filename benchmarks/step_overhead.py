"""What a decode step costs outside the target's forward, and what the n-gram table adds, per decode mode.

    python benchmarks/step_overhead.py --weights q4 --prompts mt-bench --limit 4 --rounds 3
    python benchmarks/step_overhead.py --weights bf16 --prompts mt-bench --limit 8 --rounds 1

Four decoders of the embedded target run the same prompts in one process, interleaved (the order rotates by one
per prompt): the target alone (`ours-baseline`), adaptive trees without lookup, and the default (trees with prompt
lookup) without and with the draft's n-gram table (`--no-ngrams`, docs/design.md §9). For each it reports the
seconds in the target's forward and the seconds outside it (the decode loop, policy, lookup, draft), per step and
in all; tok/s; tokens per step; and the paired median ratio of tok/s against the target alone. Greedy, K = the
draft's, --max-new-tokens new tokens. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

from blockdraft.hardware import describe_line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", choices=["q4", "bf16"], default="q4")
    parser.add_argument("--prompts", default="mt-bench")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="times every prompt runs on every decoder")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from blockdraft.api import encode
    from blockdraft.decode.decoder import Decoder
    from blockdraft.decode.options import PRESETS
    from blockdraft.io.drafts import load_draft
    from blockdraft.io.targets import load_target
    from blockdraft.prompts import load_prompts

    target = load_target(weights=args.weights)
    with_table, without = load_draft(None, target), load_draft(None, target, ngrams=False)
    K = with_table.config.block_size
    decoders = {
        "ours-baseline": Decoder(target, None, replace(PRESETS["chain"], block_size=K)),
        "adaptive trees": Decoder(target, without, replace(PRESETS["adaptive"], block_size=K)),
        "default, no table": Decoder(target, without, replace(PRESETS["default"], block_size=K)),
        "default": Decoder(target, with_table, replace(PRESETS["default"], block_size=K)),
    }
    prompts = [encode(target, list(p.messages)) for p in load_prompts(args.prompts)[: args.limit]]
    print(describe_line(), f"torch {torch.__version__}, {args.threads} threads, weights {args.weights}, "
          f"{args.prompts} x{len(prompts)}, {args.rounds} rounds, K={K}, N={args.max_new_tokens}, greedy")

    forward_seconds = [0.0]
    plain_forward = target.forward

    def timed_forward(*a, **k):
        start = time.perf_counter()
        out = plain_forward(*a, **k)
        forward_seconds[0] += time.perf_counter() - start
        return out

    target.forward = timed_forward
    for decoder in decoders.values():  # warm-up: kernels, the cost model, the packed heads
        decoder.generate([prompts[0]], max_new_tokens=16)
    rows = {name: [] for name in decoders}  # per call: (forward s, total s, tokens, steps)
    names = list(decoders)
    for _ in range(args.rounds):
        for i, prompt in enumerate(prompts):
            for name in names[i % len(names):] + names[: i % len(names)]:
                forward_seconds[0] = 0.0
                start = time.perf_counter()
                result = decoders[name].generate([prompt], max_new_tokens=args.max_new_tokens)[0]
                total = time.perf_counter() - start
                steps = result.stats.steps if result.stats is not None else len(result.tokens)
                rows[name].append((forward_seconds[0], total, len(result.tokens), steps))
    report = {}
    for name, calls in rows.items():
        forward, total = sum(c[0] for c in calls), sum(c[1] for c in calls)
        tokens, steps = sum(c[2] for c in calls), sum(c[3] for c in calls)
        ratio = statistics.median(c[2] / c[1] / (b[2] / b[1]) for c, b in zip(calls, rows["ours-baseline"]))
        report[name] = {"forward_s": forward, "outside_s": total - forward, "outside_ms_per_step":
                        (total - forward) / steps * 1e3, "tok_s": tokens / total, "tokens_per_step": tokens / steps,
                        "vs_ours_baseline": ratio}
        print(f"{name:18s} forward {forward:7.3f} s  outside {total - forward:6.3f} s "
              f"({(total - forward) / steps * 1e3:.2f} ms a step)  {tokens / total:6.1f} tok/s  "
              f"{tokens / steps:.2f} tokens a step  {ratio:.3f}x ours-baseline (paired median)")
    print(json.dumps({"weights": args.weights, "prompts": args.prompts, "limit": len(prompts),
                      "rounds": args.rounds, "K": K, "N": args.max_new_tokens, "result": report}))


if __name__ == "__main__":
    main()
