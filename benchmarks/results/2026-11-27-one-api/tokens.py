"""Decode 8 HumanEval prompts with the default mode and the target alone; print a hash of every output and the time."""
import os, sys, time, hashlib, json
tree = os.environ["BLOCKDRAFT_TREE"]
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, tree)
import blockdraft
from blockdraft.api import encode, generate, load_draft
from blockdraft.io.targets import load_target
from blockdraft.prompts import load_prompts
weights = sys.argv[1]
target = load_target(weights=weights)
draft = load_draft(None, target)
ids = [encode(target, list(p.messages)) for p in load_prompts("humaneval", limit=8)]
out = {}
for name, d in (("alone", None), ("default", draft)):
    generate(target, d, ids[:1], max_new_tokens=8)
    start = time.perf_counter(); toks = []
    for p in ids:
        toks.append(generate(target, d, [p], max_new_tokens=128)[0].tokens)
    out[name] = (hashlib.sha256(json.dumps(toks).encode()).hexdigest()[:12], round(time.perf_counter() - start, 2))
print(weights, tree, json.dumps(out))
