"""Static batches of R rows, 128 tokens: target alone vs default vs a draft proposer that always steps plain."""
import sys, time, torch
from blockdraft.io.targets import load_target
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.generate import stream
from blockdraft.decode.proposers import TreeProposer
from blockdraft.api import load_draft, encode
from blockdraft.prompts import load_prompts
torch.set_num_threads(2)
t = load_target(None, weights="auto"); d = load_draft(None, t)
P = [encode(t, list(p.messages)) for p in load_prompts("humaneval", limit=8)]
class PlainOnly:
    def at_batch(self, rows): pass
    def choose(self): return 1
    def observe(self, width, num_accepted, within=None): pass
spec, alone = Decoder(t, d), Decoder(t, None)
def plain_prop():
    return TreeProposer(spec.drafter(), PlainOnly())
def run(kind, rows):
    prompts = [P[i % len(P)] for i in range(rows)]
    s = time.perf_counter(); n = 0
    if kind == "plain-draft":
        it = stream(t, plain_prop(), prompts, max_new_tokens=128, stop_token_ids=[])
    else:
        it = (alone if kind == "alone" else spec).stream(prompts, max_new_tokens=128, stop_token_ids=[])
    for ev in it: n += len(ev.tokens)
    return n / (time.perf_counter() - s)
for rows in map(int, sys.argv[1:]):
    res = {}
    for r in range(3):
        for k in ("alone", "plain-draft", "default"):
            res.setdefault(k, []).append(run(k, rows))
    a = sum(res["alone"])
    print(rows, {k: (round(sum(v) / 3, 1), round(sum(v) / a, 3)) for k, v in res.items()}, flush=True)
