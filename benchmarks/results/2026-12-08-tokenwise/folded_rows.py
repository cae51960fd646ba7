"""Folded attention rows against token by token: random blocks of T new tokens (SmolLM2's 3 query heads per
key/value head of 64) over spans on the grid, each token masked causally, in bf16 and float32; how many blocks
with each key/value head's rows folded into one kernel call part from their tokens attended one at a time.

    MKL_CBWR=AUTO,STRICT python folded_rows.py
"""

import torch
import torch.nn.functional as F

from blockdraft.hardware import describe_line

torch.set_num_threads(2)
torch.manual_seed(0)
GROUPS, KV_HEADS, HEAD_DIM = 3, 3, 64
print(describe_line())
for dtype in (torch.bfloat16, torch.float32):
    apart = total = 0
    for span in range(128, 600, 16):
        for tokens in (2, 4, 9):
            k, v = (torch.randn(1, KV_HEADS, span, HEAD_DIM).to(dtype) for _ in range(2))
            q = torch.randn(1, KV_HEADS, GROUPS * tokens, HEAD_DIM).to(dtype)  # row i*T + t: head i, token t
            sees = torch.ones(tokens, span, dtype=torch.bool)
            for t in range(tokens):
                sees[t, span - 16 - tokens + t + 1:] = False
            bias = torch.zeros(1, 1, GROUPS, tokens, span, dtype=dtype).masked_fill_(~sees, float("-inf"))
            folded = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.reshape(1, 1, GROUPS * tokens, span))
            rows = q.view(1, KV_HEADS, GROUPS, tokens, HEAD_DIM)
            alone = torch.stack([F.scaled_dot_product_attention(rows[:, :, :, t], k, v, attn_mask=bias[:, :, :, t])
                                 for t in range(tokens)], 3)
            apart += not torch.equal(folded.view_as(alone), alone)
            total += 1
    print(f"{dtype}: {apart} of {total} folded blocks apart from their tokens alone")
