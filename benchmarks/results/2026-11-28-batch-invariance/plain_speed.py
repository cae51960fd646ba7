import sys, os, time
if os.environ.get('OLD'):
    sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in type(f).__module__ and 'editable' not in repr(f)]
    sys.path.insert(0, '/tmp/s9/old')
import torch
import blockdraft; print(blockdraft.__file__, file=sys.stderr)
torch.set_num_threads(2)
from blockdraft.io.targets import load_target
from blockdraft.io.prompts import encode_prompt
from blockdraft.prompts import load_prompts
from blockdraft.decode.decoder import Decoder
w = sys.argv[1]
kw = {"weights": "q4"} if w == "q4" else {"dtype": getattr(torch, w)}
target = load_target(**kw)
ps = [encode_prompt(target.tokenizer, p.messages) for p in load_prompts("humaneval", 8)]
dec = Decoder(target, None)
dec.generate([ps[0]], max_new_tokens=8)
best = {}
for rows in (1, 8):
    ts = []
    for r in range(3):
        t = time.perf_counter(); dec.generate(ps[:rows], max_new_tokens=64); ts.append(time.perf_counter() - t)
    best[rows] = min(ts)
print(w, sys.argv[2], " ".join(f"rows{r}: {64*r/t:.1f} tok/s" for r, t in best.items()))
