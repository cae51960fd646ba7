"""An int4 forward of SmolLM2 over T new tokens (a chain verify block), its rows folded per key/value head against
token by token (layers.tokenwise_sdpa), alternating in one process: seven rounds, each the minimum of 20 calls,
the median over rounds.

    python forward_time.py
"""

import statistics
import time

import torch

import blockdraft.model.target as target_module
from blockdraft.api import encode
from blockdraft.hardware import describe_line
from blockdraft.io.targets import load_target
from blockdraft.prompts import load_prompts

WIDTHS = (1, 2, 3, 4, 5, 8, 9)
ROWS = {"folded": 1, "tokenwise": target_module.TOKENWISE_ROWS}  # blocks of more tokens than this fold their rows

torch.set_num_threads(2)
target = load_target(weights="q4")
ids = encode(target, list(load_prompts("humaneval", limit=1)[0].messages))
n = len(ids)
cache = target.new_cache(1, n + 64)
target.forward(torch.tensor(ids)[None], torch.arange(n)[None], cache, prompt=True)
seconds = {}
for _ in range(7):
    for T in WIDTHS:
        for name, rows in ROWS.items():
            target_module.TOKENWISE_ROWS = rows
            tokens, positions = torch.randint(0, 49152, (1, T)), torch.arange(n, n + T)[None]
            calls = []
            for _ in range(20):
                start = time.perf_counter()
                target.forward(tokens, positions, cache, tap_layer_ids=(1, 8, 15, 22, 29),
                               logit_rows=torch.arange(T)[None])
                calls.append(time.perf_counter() - start)
            seconds.setdefault((T, name), []).append(min(calls))
print(describe_line(), f"| q4 | prompt of {n} tokens | 2 threads")
for T in WIDTHS:
    folded, tokenwise = (statistics.median(seconds[(T, name)]) for name in ROWS)
    print(f"T={T}: folded {folded * 1e3:.2f} ms, tokenwise {tokenwise * 1e3:.2f} ms, "
          f"+{(tokenwise - folded) * 1e3:.2f} ms ({tokenwise / folded:.3f}x)")
