"""Where a target step's time goes: wall time and a per-op profile of one decode step of the embedded target.

    python benchmarks/step_profile.py --weights q4 --threads 2
    python benchmarks/step_profile.py --weights bf16 --widths 1,9 --steps 64

For each width W (1: the target alone; K + 1: a chain verify), the target prefills a fixed prompt, then runs
`--steps` forwards of W new tokens against its cache (rolled back after each, so every step sees the same
context). It reports the median wall time of a step, then profiles the same steps with torch.profiler and
groups the CPU self-time of each aten op into: linears (int4 or bf16 products, the head), attention, norms,
RoPE, cache writes, residual adds, the MLP activation, and the rest; with the number of ops dispatched per step.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

from blockdraft.hardware import describe_line

PROMPT = "Write a Python function that checks whether a string is a palindrome."
# aten op name -> group (the first group whose any key is in the name). Ops the target's forward dispatches.
GROUPS = {
    "linear": ("_weight_int4pack_mm", "mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "aten::linear",
               "aten::matmul", "mkldnn_linear"),
    "attention": ("scaled_dot_product", "_flash_attention", "aten::bmm", "aten::softmax", "aten::_softmax"),
    "norm": ("rms_norm", "aten::pow", "aten::mean", "aten::rsqrt"),
    "rope": ("aten::neg", "aten::cat"),
    "cache": ("aten::copy_", "aten::slice_scatter", "aten::index_put"),
    "activation": ("aten::silu",),
    "elementwise": ("aten::mul", "aten::add", "aten::to", "aten::_to_copy"),
}


def group_of(name: str) -> str:
    for group, keys in GROUPS.items():
        if any(key in name for key in keys):
            return group
    return "other"


def step_runner(target, prompt_ids: list[int], width: int):
    """A function that runs one forward of `width` new tokens after the prompt and rolls the cache back."""
    length = len(prompt_ids)
    cache = target.new_cache(1, length + width + 8)
    ids = torch.tensor([prompt_ids])
    positions = torch.arange(length)[None]
    target.forward(ids, positions, cache)
    cache.crop_to(torch.tensor([length]))
    new_ids = torch.tensor([prompt_ids[-width:]])  # [1, W] any tokens: the cost does not depend on them
    new_positions = (length + torch.arange(width))[None]
    rows = torch.arange(width)[None]

    def step() -> None:
        target.forward(new_ids, new_positions, cache, logit_rows=rows)
        cache.crop_to(torch.tensor([length]))

    return step


def profile_width(target, prompt_ids: list[int], width: int, steps: int) -> dict:
    step = step_runner(target, prompt_ids, width)
    with torch.inference_mode():
        for _ in range(8):
            step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            for _ in range(steps):
                step()
    groups, counts = defaultdict(float), defaultdict(int)
    for event in profiler.key_averages():
        group = group_of(event.key)
        groups[group] += event.self_cpu_time_total / steps / 1e3  # ms per step
        counts[group] += event.count // steps
    return {"width": width, "step_ms": statistics.median(times), "profiled_ms": sum(groups.values()),
            "ops_per_step": sum(counts.values()), "groups_ms": dict(groups), "group_ops": dict(counts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", choices=["q4", "bf16"], default="q4")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--widths", default="1,9", help="comma-separated step widths (new tokens per step)")
    parser.add_argument("--steps", type=int, default=48, help="steps timed (and profiled) per width")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from blockdraft.api import encode
    from blockdraft.io.targets import load_target

    target = load_target(weights=args.weights)
    prompt_ids = encode(target, PROMPT)
    print(describe_line(), f"torch {torch.__version__}, {args.threads} threads, weights {args.weights}, "
          f"prompt {len(prompt_ids)} tokens")
    results = []
    for width in (int(w) for w in args.widths.split(",")):
        result = profile_width(target, prompt_ids, width, args.steps)
        results.append(result)
        parts = ", ".join(f"{g} {ms:.2f} ({result['group_ops'][g]} ops)"
                          for g, ms in sorted(result["groups_ms"].items(), key=lambda kv: -kv[1]))
        print(f"width {width}: {result['step_ms']:.2f} ms a step, {result['ops_per_step']} ops; "
              f"profiled (ms a step): {parts}")
    print(json.dumps({"weights": args.weights, "threads": args.threads, "prompt": PROMPT, "results": results}))


if __name__ == "__main__":
    main()
