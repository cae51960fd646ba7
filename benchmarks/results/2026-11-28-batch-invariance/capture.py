import torch, inspect
torch.set_num_threads(2)
import blockdraft.model.scripted as S
src = inspect.getsource(S.run_layers)
src = src.replace("            attended = F.scaled_dot_product_attention(folded, context_k, context_v, attn_mask=bias)\n",
 "            CAP.append((layer, folded.clone(), context_k.clone(), context_v.clone(), None if bias is None else bias.clone()))\n            attended = F.scaled_dot_product_attention(folded, context_k, context_v, attn_mask=bias)\n")
ns = dict(S.__dict__); CAP = []; ns["CAP"] = CAP
exec(src, ns)
S._SCRIPTED = ns["run_layers"]
from blockdraft.io.targets import load_target
from blockdraft.io.prompts import encode_prompt
from blockdraft.prompts import load_prompts
from blockdraft.decode.decoder import Decoder
target = load_target(weights="q4")
ps = [encode_prompt(target.tokenizer, p.messages) for p in load_prompts("humaneval", 8)]
dec = Decoder(target, None)
def run(prompts, steps):
    CAP.clear(); dec.generate(prompts, max_new_tokens=steps); return list(CAP)
a = run([ps[2]], 72); b = run(ps[1:3], 72)
print(len(a), len(b))
# decode forwards only have the non-causal branch: 30 per forward, forward f>=1 -> index (f-1)*30+layer
i = (70 - 1) * 30 + 23
torch.save({"a": a[i-30*3:i+30], "b": b[i-30*3:i+30]}, "/tmp/s9/cap.pt")
la, qa, ka, va, ma = a[i]; lb, qb, kb, vb, mb = b[i]
print(la, lb, qa.shape, ka.shape, None if ma is None else ma.shape, qb.shape, kb.shape, None if mb is None else mb.shape)
