"""Blocks of the embedded target against their one-token steps under inference mode, as decoding runs them:
which rows' logits equal, and the first layer where each row parts.

    python block_vs_steps.py tokenwise|folded [bf16|q4|fp32]      (BLOCKDRAFT_CPU=avx512: ATen's bf16 kernel)
"""
import torch, sys
import blockdraft.model.target as TM
from blockdraft.io.targets import load_target
from blockdraft.model.span import on_span_grid
torch.set_num_threads(2); torch.set_grad_enabled(False)
if sys.argv[1] == "folded": TM.tokenwise_sdpa = TM.grouped_sdpa
target = load_target(weights=sys.argv[2] if len(sys.argv) > 2 else "bf16")
L, D = target.num_layers, 576
for seed, (n, T) in enumerate([(150, 9), (166, 9), (159, 4), (122, 9), (300, 5)]):
    ids = torch.randint(3, 49152, (1, n + T), generator=torch.Generator().manual_seed(seed))
    outs = []
    for width in (T, 1):
        cache = target.new_cache(1, on_span_grid(n + T))
        target.forward(ids[:, :n], torch.arange(n)[None], cache, prompt=True)
        lg, ft = [], []
        for at in range(0, T, width):
            o = target.forward(ids[:, n + at: n + at + width], torch.arange(n + at, n + at + width)[None], cache,
                               tap_layer_ids=tuple(range(L)), logit_rows=torch.arange(width)[None])
            lg.append(o.logits[0]); ft.append(o.features[0])
        outs.append((torch.cat(lg), torch.cat(ft)))
    (bl, bf), (sl, sf) = outs
    first = []
    for t in range(T):
        apart = [j for j in range(L) if not torch.equal(bf[t, j*D:(j+1)*D], sf[t, j*D:(j+1)*D])]
        first.append(apart[0] if apart else None)
    print(sys.argv[1], n, T, "logits equal", sum(torch.equal(bl[t], sl[t]) for t in range(T)), "/", T, "first apart", first, flush=True)
