"""q4 default mode priced two ways, beside the target alone, interleaved per prompt in one process: `open`, the
cached step costs (drafted and plain steps timed over a 64-position prompt, ragged ones over 256), and `open256`,
drafted and plain steps timed afresh over a 256-position prompt as ragged ones are. Per arm as open_closed.py.
    python benchmarks/results/2026-12-06-stage21/open_256.py q4 humaneval [DRAFT]"""
import json, statistics, sys, time
from collections import defaultdict
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import step_truth
import blockdraft.decode.generate as generate
from blockdraft.api import encode
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.options import PRESETS
from blockdraft.decode.policy import TreeWidth
from blockdraft.hardware import describe_line
from blockdraft.io.drafts import load_draft
from blockdraft.io.targets import load_target
from blockdraft.prompts import load_prompts

torch.set_num_threads(2)
weights, name = sys.argv[1], sys.argv[2]
draft_path = sys.argv[3] if len(sys.argv) > 3 else None
choose = TreeWidth.choose
import blockdraft.decode.decoder as decoder_module
import blockdraft.decode.measure as measure
from blockdraft.decode.policy import candidate_widths
measured = decoder_module.measured_costs
target = load_target(weights=weights)
draft = load_draft(draft_path, target)
decoders = {"alone": Decoder(target, None, PRESETS["chain"]), "open": Decoder(target, draft, PRESETS["default"]),
            "open256": Decoder(target, draft, PRESETS["default"])}
drafter = decoders["open256"].drafter(PRESETS["default"])
base = measured(target, drafter, True, 1)
measure.PROMPT_LENGTH = 256
t256 = measure.measure_costs(lambda b, w, n: measure._timed_steps(target, drafter, True, b, w, n),
                             candidate_widths(2 * drafter.block_size), [1])
t256.ragged = base.ragged
measure.PROMPT_LENGTH = 64
print("table", {"plain": base.plain, "drafted": base.drafted})
print("table256", {"plain": t256.plain, "drafted": t256.drafted})
prompts = [encode(target, list(p.messages)) for p in load_prompts(name)[:int(__import__("os").environ.get("LIMIT", 8))]]
print(describe_line(), f"torch {torch.__version__}, weights {weights}, {name} x{len(prompts)}, draft {draft_path or 'shipped'}")
log = step_truth.StepLog(generate)


def arm(m):
    TreeWidth.choose = (lambda self: 1) if m == "closed" else choose
    decoder_module.measured_costs = (lambda *a, **k: t256) if m == "open256" else measured


for m in decoders:
    arm(m)
    decoders[m].generate([prompts[0]], max_new_tokens=16)
rows = {m: [] for m in decoders}
records = {m: [] for m in decoders}
order = list(decoders)
for i, prompt in enumerate(prompts):
    for m in order[i % len(order):] + order[: i % len(order)]:
        arm(m)
        log.records = []
        with log:
            start = time.perf_counter()
            result = decoders[m].generate([prompt], max_new_tokens=int(__import__("os").environ.get("N", 128)))[0]
            seconds = time.perf_counter() - start
        rows[m].append(dict(tok_s=len(result.tokens) / seconds, seconds=seconds, tokens=len(result.tokens),
                            stepped=sum(r["seconds"] for r in log.records)))
        records[m].append(log.records)
out = {}
for m in ("open", "open256"):
    ratio = statistics.median(r["tok_s"] / a["tok_s"] for r, a in zip(rows[m], rows["alone"]))
    wall, stepped = sum(r["seconds"] for r in rows[m]), sum(r["stepped"] for r in rows[m])
    split = defaultdict(list)
    for recs in records[m]:
        prev = "start"
        for r in recs:
            split[(r["kind"], prev)].append(r["seconds"])
            prev = r["kind"]
    kinds = {f"{k} after {p}": (len(v), 1e3 * sum(v) / len(v)) for (k, p), v in sorted(split.items())}
    out[m] = dict(vs_alone=ratio, wall=wall, stepped=stepped, tokens=sum(r["tokens"] for r in rows[m]), kinds=kinds)
    print(f"{name} {m:6s} {ratio:.3f}x alone; wall {wall:.2f} s, steps {stepped:.2f} s "
          f"({wall - stepped:.2f} s outside steps)")
    for k, (n, ms) in kinds.items():
        print(f"    {k:22s} {n:4d} steps {ms:6.2f} ms")
print(json.dumps(out))
