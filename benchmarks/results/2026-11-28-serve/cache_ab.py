"""16 rows joining and leaving, whole-capacity row copies (old) vs in-place (new), both modes, interleaved."""
import time, torch
from blockdraft.cache import KVCache
from blockdraft.io.targets import load_target
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.generate import Admission
from blockdraft.api import load_draft, encode
from blockdraft.prompts import load_prompts
torch.set_num_threads(2)
t = load_target(None, weights="auto"); d = load_draft(None, t)
P = [encode(t, list(p.messages)) for p in load_prompts("humaneval", limit=8)]
modes = {"spec": Decoder(t, d), "alone": Decoder(t, None)}
new_keep, new_add = KVCache.keep_rows, KVCache.add_rows
def old_keep(self, rows):
    self._held_keys = self.keys = [k[rows] for k in self.keys]; self._held_values = self.values = [v[rows] for v in self.values]; self.lengths = self.lengths[rows]
def old_add(self, other):
    self._held_keys = self.keys = [torch.cat([a, b]) for a, b in zip(self.keys, other.keys)]
    self._held_values = self.values = [torch.cat([a, b]) for a, b in zip(self.values, other.values)]
    self.lengths = torch.cat([self.lengths, other.lengths])
ROWS, TOTAL, N = 16, 48, 128
def run(dec):
    sent = [ROWS]; live = [ROWS]; tokens = [0]
    def admit(room):
        k = min(ROWS - live[0], TOTAL - sent[0])
        out = [Admission(P[(sent[0] + i) % len(P)], N) for i in range(k)]
        sent[0] += k; live[0] += k
        return out
    s = time.perf_counter()
    for ev in dec.stream([P[i % len(P)] for i in range(ROWS)], max_new_tokens=N, admit=admit, room=1024, max_rows=ROWS):
        tokens[0] += len(ev.tokens)
        if ev.finish_reason is not None: live[0] -= 1
    return tokens[0] / (time.perf_counter() - s)
res = {}
run(modes["alone"])
for r in range(2):
    for impl in ("old", "new"):
        KVCache.keep_rows, KVCache.add_rows = (old_keep, old_add) if impl == "old" else (new_keep, new_add)
        for m in ("alone", "spec"):
            res.setdefault((m, impl), []).append(run(modes[m]))
for k, v in res.items(): print(k, [round(x, 1) for x in v], flush=True)
for m in ("alone", "spec"):
    print(m, "new/old", round(sum(res[(m, "new")]) / sum(res[(m, "old")]), 3))
print("spec/alone old", round(sum(res[("spec", "old")]) / sum(res[("alone", "old")]), 3), "new", round(sum(res[("spec", "new")]) / sum(res[("alone", "new")]), 3))
