import sys, os, torch
torch.set_num_threads(2)
from blockdraft.io.targets import load_target
from blockdraft.api import load_draft
from blockdraft.io.prompts import encode_prompt
from blockdraft.prompts import load_prompts
from blockdraft.decode.decoder import Decoder
from blockdraft.decode.options import DecodeOptions
w = sys.argv[1]; sets = sys.argv[2].split(",")
target = load_target(**({"weights": "q4"} if w == "q4" else {"dtype": getattr(torch, w)}))
draft = load_draft(target=target)
for name in sets:
    ps = [encode_prompt(target.tokenizer, p.messages) for p in load_prompts(name, 8)]
    alone = Decoder(target, None)
    chain = Decoder(target, draft, DecodeOptions(tree=False, adaptive=False, lookup=False))
    tree = Decoder(target, draft, DecodeOptions(tree=True, adaptive=False, lookup=False))
    res = {"chain": 0, "tree": 0}
    for p in ps:
        a = alone.generate([p], max_new_tokens=128)[0].tokens
        c = chain.generate([p], max_new_tokens=128)[0].tokens
        res["chain"] += c == a
        if c != a: print("  chain differs: prompt", ps.index(p), "at token", next(k for k,(x,y) in enumerate(zip(a,c)) if x!=y))
        res["tree"] += tree.generate([p], max_new_tokens=128)[0].tokens == a
    print(w, name, "MKL_CBWR", os.environ.get("MKL_CBWR"), "equal to the target alone:", res, "of", len(ps))
