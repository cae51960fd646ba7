"""What the proposal vocabulary saves inside llama.cpp: its DFlash with the draft scoring every id (the target's
head) against the draft scoring only its proposal ids (`d2t` and the target head's rows), same run, interleaved,
each against llama.cpp's server alone on the same prompts.

    BLOCKDRAFT_LLAMA_SERVER=.../llama-server python benchmarks/llama_dflash_head.py --prompts humaneval --limit 8

Three llama-server processes (alone, full head, reduced head) at one draft length; for each prompt every server
decodes it in turn (the order rotated per prompt). Prints tokens/s, tau and text equality with the plain server,
and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--draft-max", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from blockdraft.bench.llama_server import LlamaServer, find_llama_server
    from blockdraft.bench.methods import ServerMethod
    from blockdraft.bench.runner import interleaved_order
    from blockdraft.bench.summary import first_difference
    from blockdraft.commands.bench import _encode
    from blockdraft.io.vocab import read_vocab
    from blockdraft.hardware import describe
    from blockdraft.io.checkpoint import read_checkpoint
    from blockdraft.io.drafts import DEFAULT_DRAFT
    from blockdraft.io.gguf_draft import write_gguf_draft
    from blockdraft.io.targets import embedded_gguf_path, load_target
    from blockdraft.prompts import load_prompts

    binary = find_llama_server()
    if binary is None:
        sys.exit("no llama-server: set $BLOCKDRAFT_LLAMA_SERVER (benchmarks/README.md has the build)")
    target = load_target(None, dtype="float32")
    prompts = [_encode(target, p.messages) for p in load_prompts(args.prompts, args.limit)]
    gguf = embedded_gguf_path()
    cfg, tensors = read_checkpoint(DEFAULT_DRAFT)
    folder = Path(tempfile.mkdtemp(prefix="blockdraft-head-"))
    files = {"full head": folder / "full.gguf", "proposal ids (d2t)": folder / "d2t.gguf"}
    write_gguf_draft(files["full head"], cfg, tensors, gguf)
    write_gguf_draft(files["proposal ids (d2t)"], cfg, tensors, gguf, vocab=read_vocab(DEFAULT_DRAFT, cfg.vocab_size))
    methods = [ServerMethod("alone", LlamaServer(binary, gguf, None, None, args.threads, 8192), None)]
    methods += [ServerMethod(name, LlamaServer(binary, gguf, file, args.draft_max, args.threads, 8192),
                             args.draft_max) for name, file in files.items()]
    by_name = {m.name: m for m in methods}
    rates = {m.name: [] for m in methods}
    tokens = {m.name: [] for m in methods}
    steps = {m.name: [0, 0] for m in methods}  # [tokens counted toward tau, steps]
    try:
        for method in methods:  # warm-up
            method.decode(prompts[:1], 16)
        for index, prompt in enumerate(prompts):
            for name in interleaved_order(list(by_name), index):
                start = time.perf_counter()
                [decoded] = by_name[name].decode([prompt], args.max_new_tokens)
                rates[name].append(len(decoded.tokens) / (time.perf_counter() - start))
                tokens[name].append(decoded.tokens)
                if decoded.stats is not None:
                    steps[name][0] += decoded.stats.tokens
                    steps[name][1] += decoded.stats.steps
    finally:
        for method in methods:
            method.close()

    hardware = describe(torch.device("cpu"), torch.float32, False)["device"]
    print(f"{hardware} | llama.cpp DFlash, draft length {args.draft_max} | {args.prompts} x{len(prompts)} | "
          f"{args.max_new_tokens} new tokens | greedy")
    result = {}
    for name in by_name:
        ratios = [r / a for r, a in zip(rates[name], rates["alone"])]
        equal = sum(first_difference(a, b) is None for a, b in zip(tokens["alone"], tokens[name]))
        tau = steps[name][0] / steps[name][1] if steps[name][1] else None
        result[name] = {"tok_s": round(statistics.median(rates[name]), 2),
                        "vs_alone": round(statistics.median(ratios), 3), "equal_alone": equal,
                        "mean_tau": None if tau is None else round(tau, 3)}
        print(f"  {name:20s} {result[name]['tok_s']:7.1f} tok/s  {result[name]['vs_alone']:.2f}x alone  "
              f"tau {'-' if tau is None else f'{tau:.2f}'}  text = alone on {equal}/{len(prompts)}")
    print(json.dumps({"bench": args.prompts, "prompts": len(prompts), "N": args.max_new_tokens,
                      "draft_max": args.draft_max, "device": hardware, "methods": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
