import torch
from blockdraft.api import encode, generate
from blockdraft.io.targets import load_target
from blockdraft.io.drafts import load_draft
from blockdraft.prompts import load_prompts
import blockdraft.decode.step as S
torch.set_num_threads(2)
target = load_target(weights="q4")
draft = load_draft(None, target)
left = {"n": 0, "steps": 0}
orig = S.in_own_block
def spy(*a):
    k = orig(*a); left["n"] += int((~k).sum()); left["steps"] += int((~k).any()); return k
S.in_own_block = spy
msgs = [{"role": "user", "content": "Write a long, detailed story about a lighthouse keeper and a storm, in at least 20 paragraphs."}]
for p in [msgs, list(load_prompts("mt-bench", limit=3)[2].messages)]:
    ids = encode(target, p)
    alone = generate(target, None, ids, chat=False, max_new_tokens=700)
    tree = generate(target, draft, ids, chat=False, max_new_tokens=700, tree=True, adaptive=False, lookup=False)
    dflt = generate(target, draft, ids, chat=False, max_new_tokens=700)
    a = alone.tokens
    for name, c in (("tree", tree), ("default", dflt)):
        first = next((j for j, (x, y) in enumerate(zip(a, c.tokens)) if x != y), None)
        print(name, "prompt", len(ids), "tokens", len(a), len(c.tokens), "equal", a == c.tokens, "first apart", first, "left-out nodes", left)
