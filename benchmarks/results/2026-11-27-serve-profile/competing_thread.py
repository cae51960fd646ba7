"""Batch-8 decode, target alone vs default, with and without a competing pure-Python thread (an event loop's work)."""
import threading, time, json
import torch
from blockdraft.api import encode, load_draft
from blockdraft.io.targets import load_target
from blockdraft.prompts import load_prompts
from blockdraft.decode.decoder import Decoder
torch.set_num_threads(2)
target = load_target()
draft = load_draft(None, target)
ids = [encode(target, list(p.messages)) for p in load_prompts("humaneval", limit=8)]
spec, alone = Decoder(target, draft), Decoder(target, None)
stop = threading.Event()
def busy():  # JSON work in slices, as an event loop formatting SSE chunks would
    payload = {"choices": [{"delta": {"content": "x" * 40}, "index": 0}], "id": "chatcmpl-1", "object": "chunk"}
    while not stop.is_set():
        for _ in range(50):
            json.dumps(payload)
        time.sleep(0.0005)
def run(decoder):
    t = time.perf_counter(); n = sum(len(r.tokens) for r in decoder.generate(ids, max_new_tokens=128)); return n / (time.perf_counter() - t)
run(spec); run(alone)
for competing in (False, True, False, True):
    if competing:
        stop.clear(); th = threading.Thread(target=busy, daemon=True); th.start()
    a, s = run(alone), run(spec)
    a2, s2 = run(alone), run(spec)
    if competing:
        stop.set(); th.join()
    print(f"competing={competing}: alone {a:.1f}/{a2:.1f} spec {s:.1f}/{s2:.1f} ratio {(s+s2)/(a+a2):.3f}", flush=True)
