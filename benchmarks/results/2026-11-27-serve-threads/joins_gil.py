"""16 rows joining and leaving, target alone vs default, with a second Python thread that does an event loop's
per-event work (a JSON chunk per delivered event, handed over through a queue) or without it."""
import json, queue, threading, time, sys, torch
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
events = queue.SimpleQueue()
def loop():
    payload = {"choices": [{"delta": {"content": "x" * 12}, "index": 0}], "id": "chatcmpl-1", "object": "chunk"}
    while (item := events.get()) is not None:
        for _ in range(20):
            json.dumps(payload)
def run(dec, competing):
    sent = [ROWS]; live = [ROWS]; tokens = [0]
    def admit(room):
        k = min(ROWS - live[0], TOTAL - sent[0])
        out = [Admission(P[(sent[0] + i) % len(P)], N) for i in range(k)]
        sent[0] += k; live[0] += k
        return out
    s = time.perf_counter()
    for ev in dec.stream([P[i % len(P)] for i in range(ROWS)], max_new_tokens=N, admit=admit, room=1024, max_rows=ROWS):
        tokens[0] += len(ev.tokens)
        if competing:
            events.put(ev.tokens)
        if ev.finish_reason is not None:
            live[0] -= 1
    return tokens[0] / (time.perf_counter() - s)
th = threading.Thread(target=loop, daemon=True); th.start()
run(spec, False); run(alone, False)
for competing in (False, True, False, True):
    a = [run(alone, competing) for _ in range(2)]; b = [run(spec, competing) for _ in range(2)]
    print(f"competing={competing}: alone {[round(x,1) for x in a]} spec {[round(x,1) for x in b]} ratio {sum(b)/sum(a):.3f}", flush=True)
events.put(None)
