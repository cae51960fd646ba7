import time, torch, cProfile, pstats, sys
from blockdraft.io.targets import load_target
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.generate import Admission
from blockdraft.api import load_draft, encode
from blockdraft.prompts import load_prompts
torch.set_num_threads(2)
t = load_target(None, weights="auto")
d = load_draft(None, t)
P = [encode(t, list(p.messages)) for p in load_prompts("humaneval", limit=8)]
spec, alone = Decoder(t, d), Decoder(t, None)
ROWS, TOTAL, N = 16, 48, 128
def run(dec):
    sent = [ROWS]; finished = [0]; tokens = [0]
    live = [ROWS]
    def admit(room):
        free = ROWS - live[0]
        k = min(free, TOTAL - sent[0])
        out = [Admission(P[(sent[0] + i) % len(P)], N) for i in range(k)]
        sent[0] += k; live[0] += k
        return out
    s = time.perf_counter()
    for ev in dec.stream([P[i % len(P)] for i in range(ROWS)], max_new_tokens=N, admit=admit, room=1024, max_rows=ROWS):
        tokens[0] += len(ev.tokens)
        if ev.finish_reason is not None:
            live[0] -= 1
    return tokens[0] / (time.perf_counter() - s)
run(spec); run(alone)
if len(sys.argv) > 1:
    for mode, dec in (("spec", spec), ("alone", alone)):
        pr = cProfile.Profile(); pr.enable(); run(dec); pr.disable()
        st = pstats.Stats(pr); print(mode); st.sort_stats("tottime").print_stats(25)
    sys.exit()
a, b = [], []
for i in range(3):
    a.append(run(alone)); b.append(run(spec))
print("alone", [round(x,1) for x in a], "spec", [round(x,1) for x in b], "ratio %.3f" % (sum(b)/sum(a)))
