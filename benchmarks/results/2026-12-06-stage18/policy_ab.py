"""The tree policy's re-tries and the runs' plain steps, before and after, in one process: the default mode with
each arm, and the target alone, interleaved per prompt (the order rotating), greedy, 8 prompts of HumanEval and
MT-Bench, 128 new tokens, K = 8, 2 threads, the shipped draft (or argv[2]). Arms: `before` (every other re-try the
widest tree; a tree whenever the width policy drafts), `re-try` (the widest tree that fits the re-try budget:
policy.TreeWidth._explore), `re-try+ragged` (and the runs on a plain step where that beats the tree with its
graft: proposers.TreeProposer._ragged_first). The earlier arms are this code with the later changes patched out.

    python benchmarks/results/2026-12-06-stage18/policy_ab.py q4 [DRAFT] [ARM,ARM,...]
"""
import json
import statistics
import sys
import time

import torch

from blockdraft.api import encode
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.options import PRESETS
from blockdraft.decode.policy import TreeWidth
from blockdraft.decode.proposers import TreeProposer
from blockdraft.hardware import describe_line
from blockdraft.io.drafts import load_draft
from blockdraft.io.targets import load_target
from blockdraft.prompts import load_prompts

torch.set_num_threads(2)
weights = sys.argv[1]
draft_path = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "shipped" else None
arms = sys.argv[3].split(",") if len(sys.argv) > 3 else ["before", "re-try", "re-try+ragged"]
new_explore = TreeWidth._explore
new_ragged = getattr(TreeProposer, "_ragged_first", None)


def old_explore(self, ranked, count):  # every other re-try the widest tree, whatever it costs
    widest = self.widths[-1]
    return widest if count % 2 and ranked[0] != widest else ranked[1]


PATCHES = {"before": (old_explore, lambda *args: False), "re-try": (new_explore, lambda *args: False),
           "re-try+ragged": (new_explore, new_ragged)}


def patch(arm: str) -> None:
    explore, ragged = PATCHES.get(arm, (new_explore, new_ragged))
    TreeWidth._explore = explore
    if ragged is not None:
        TreeProposer._ragged_first = ragged


target = load_target(weights=weights)
draft = load_draft(draft_path, target)
decoders = {"alone": Decoder(target, None, PRESETS["chain"])} | {a: Decoder(target, draft, PRESETS["default"])
                                                                 for a in arms}
print(describe_line(), f"torch {torch.__version__}, weights {weights}, draft {draft_path or 'shipped'}, K=8, N=128")
report = {}
for name in ("humaneval", "mt-bench"):
    prompts = [encode(target, list(p.messages)) for p in load_prompts(name)[:8]]
    rows = {m: [] for m in decoders}
    order = list(decoders)
    for m in order:  # warm-up: kernels, the cost model, the packed heads
        patch(m)
        decoders[m].generate([prompts[0]], max_new_tokens=16)
    for i, prompt in enumerate(prompts):
        for m in order[i % len(order):] + order[: i % len(order)]:
            patch(m)
            start = time.perf_counter()
            result = decoders[m].generate([prompt], max_new_tokens=128)[0]
            seconds = time.perf_counter() - start
            stats = result.stats
            steps = sum(stats.histogram) if stats else len(result.tokens)
            plain = stats.plain_steps if stats else steps
            lookup = stats.lookup_steps if stats else 0
            rows[m].append(dict(tok_s=len(result.tokens) / seconds, steps=steps, plain=plain, lookup=lookup))
    report[name] = {}
    for m in arms:
        ratio = statistics.median(r["tok_s"] / a["tok_s"] for r, a in zip(rows[m], rows["alone"]))
        steps, plain, lookup = (sum(r[k] for r in rows[m]) for k in ("steps", "plain", "lookup"))
        report[name][m] = dict(vs_alone=ratio, steps=steps, plain=plain, lookup=lookup, drafted=steps - plain - lookup)
        print(f"{name:9s} {m:13s} {ratio:.3f}x the target alone (median of per-prompt ratios); {steps} steps: "
              f"{plain} plain, {lookup} with lookup, {steps - plain - lookup} drafted without")
print(json.dumps({"weights": weights, "draft": draft_path or "shipped", "results": report}))
