"""Rows joining and leaving (q4, continuous batching, HumanEval x8, 128 tokens): the target alone, the default mode
with the re-try budget for the whole batch (before), and shared by its rows (after); interleaved rounds.

    python budget_ab.py ROWS TOTAL ROUNDS
"""
import sys, time, torch
import blockdraft.decode.lookup as lookup_module
import blockdraft.decode.policy as policy_module
from blockdraft.api import encode, load_draft
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.generate import Admission, stream
from blockdraft.hardware import describe_line
from blockdraft.io.targets import load_target
from blockdraft.prompts import load_prompts

torch.set_num_threads(2)
t = load_target(None, weights="auto"); d = load_draft(None, t)
P = [encode(t, list(p.messages)) for p in load_prompts("humaneval", limit=8)]
ROWS, TOTAL, ROUNDS, N = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), 128
spec, alone = Decoder(t, d), Decoder(t, None)
shared = policy_module.budgeted_interval
def whole_batch(interval, lost, best_seconds, budget, rows=1):
    return shared(interval, lost, best_seconds, budget, 1)
def run(kind):
    for module in (policy_module, lookup_module):
        module.budgeted_interval = whole_batch if kind == "before" else shared
    prop = (alone if kind == "alone" else spec).proposer(ROWS)
    sent, live, tokens, steps = [ROWS], [ROWS], [0], [0]
    def admit(room):
        k = min(ROWS - live[0], TOTAL - sent[0])
        out = [Admission(P[(sent[0] + i) % len(P)], N) for i in range(k)]
        sent[0] += k; live[0] += k
        return out
    start = time.perf_counter()
    for ev in stream(t, prop, [P[i % len(P)] for i in range(ROWS)], max_new_tokens=N, admit=admit, room=1024,
                     stop_token_ids=[]):
        tokens[0] += len(ev.tokens)
        if ev.finish_reason is not None:
            live[0] -= 1
    return tokens[0] / (time.perf_counter() - start)
print(describe_line("cpu", t.dtype), f"; {ROWS} rows, {TOTAL} answers of {N} tokens, {ROUNDS} rounds", flush=True)
run("alone")
kinds = ["alone", "before", "after"]
res = {}
for r in range(ROUNDS):
    for k in kinds[r % 3:] + kinds[: r % 3]:
        res.setdefault(k, []).append(run(k))
a = sum(res["alone"])
for k in kinds:
    print(ROWS, k, [round(x, 1) for x in res[k]], f"{sum(res[k]) / a:.3f}x target alone", flush=True)
