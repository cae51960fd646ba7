"""What one draft forward costs as its block is cut short: the shipped draft over a 300-position context, 1 thread,
the fastest of 60 calls, at the full block (K = 8) and at blocks of 4, 3 and 2 positions (anchor included), for
the slots a step would verify (1 and K - 1). The context's features are random: the cost does not depend on them.

    python benchmarks/results/2026-12-06-stage19/draft_cost.py q4|bf16
"""

import sys
import time

import torch

from blockdraft.decode.drafter import Drafter
from blockdraft.io.drafts import load_draft
from blockdraft.io.targets import load_target

CONTEXT = 300
CALLS = 60

torch.set_num_threads(1)
torch.set_grad_enabled(False)
weights = sys.argv[1]
target = load_target(weights=weights)
draft = load_draft(None, target)
for K in (8, 4, 3, 2):
    drafter = Drafter(draft, target, K)
    drafter.start(1, 1024)
    features = torch.randn(1, CONTEXT, len(drafter.tap_layer_ids) * target.config.hidden_size)  # [1, P, L*D]
    drafter.append_context(features, torch.tensor([CONTEXT]))
    anchor, position = torch.tensor([5]), torch.tensor([CONTEXT])
    for slots in sorted({1, K - 1}):
        best = float("inf")
        for _ in range(CALLS):
            start = time.perf_counter()
            drafter._logits(anchor, position, slots)
            best = min(best, time.perf_counter() - start)
        print(f"{weights} block {K} slots {slots}: draft forward {best * 1e3:.2f} ms", flush=True)
