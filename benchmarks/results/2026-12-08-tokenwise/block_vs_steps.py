"""A 9-row block of the embedded target against 9 one-token steps from the same cache, on 3 HumanEval prompts:
which rows' features (after every layer) and logits equal their step's, and the first layer where each row parts.

    python block_vs_steps.py [q4|bf16|fp32] [tokenwise|folded]
"""

import sys

import torch

import blockdraft.model.target as target_module
from blockdraft.api import encode
from blockdraft.hardware import describe_line
from blockdraft.io.targets import load_target
from blockdraft.model.span import on_span_grid
from blockdraft.prompts import load_prompts

weights = sys.argv[1] if len(sys.argv) > 1 else "q4"
if len(sys.argv) > 2 and sys.argv[2] == "folded":
    target_module.TOKENWISE_ROWS = 1
torch.set_num_threads(2)
target = load_target(weights=weights)
print(describe_line(), "|", weights, "|", "folded" if target_module.TOKENWISE_ROWS == 1 else "tokenwise")
T, layers, D = 9, target.num_layers, target.config.hidden_size
for ids in [encode(target, list(p.messages)) for p in load_prompts("humaneval", limit=3)]:
    n = len(ids)
    new = torch.randint(0, target.config.vocab_size, (T,), generator=torch.Generator().manual_seed(n))
    runs = {}
    for width in (T, 1):  # the block, then token by token
        cache = target.new_cache(1, on_span_grid(n + T))
        target.forward(torch.tensor(ids)[None], torch.arange(n)[None], cache, prompt=True)
        logits, features = [], []
        for at in range(0, T, width):
            out = target.forward(new[None, at: at + width], torch.arange(n + at, n + at + width)[None], cache,
                                 tap_layer_ids=tuple(range(layers)), logit_rows=torch.arange(width)[None])
            logits.append(out.logits[0])
            features.append(out.features[0])
        runs[width] = torch.cat(logits), torch.cat(features)
    (block_logits, block_features), (step_logits, step_features) = runs[T], runs[1]
    first = []
    for t in range(T):
        apart = [j for j in range(layers) if not torch.equal(block_features[t, j * D:(j + 1) * D],
                                                             step_features[t, j * D:(j + 1) * D])]
        first.append(apart[0] if apart else None)
    equal = sum(torch.equal(block_logits[t], step_logits[t]) for t in range(T))
    print(f"prompt of {n} tokens: logits of {equal} of {T} rows equal; first layer apart per row {first}")
