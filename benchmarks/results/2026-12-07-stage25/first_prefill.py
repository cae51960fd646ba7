"""The first prefill of a process, bf16 target, 2 threads: a digest of its layer-1 features, then a second prefill's.

    for i in $(seq 12); do python first_prefill.py bf16; done | sort | uniq -c

On this Ice Lake (no native bf16) the first prefill of HumanEval's third prompt (122 tokens) rounded apart in 1 to 4
of every 8 to 12 processes (with MKL_NUM_THREADS=1 as well): its RoPE tables, the second thread's half of the
process's first `cos`. The second prefill of a process never did. With blockdraft/warm_threads.py (one throwaway
`cos` over every thread first) 12 of 12 agreed.
"""
import hashlib
import sys

import blockdraft  # noqa: F401 (MKL's strict mode first)
import torch

from blockdraft.api import encode
from blockdraft.io.targets import load_target
from blockdraft.prompts import load_prompts

torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
target = load_target(None, dtype=torch.bfloat16, weights=sys.argv[1] if len(sys.argv) > 1 else "bf16")
ids = encode(target, list(load_prompts("humaneval", limit=8)[2].messages))
T = len(ids)
digests = []
for _ in range(2):
    cache = target.new_cache(1, 512)
    with torch.inference_mode():  # as a decode runs it
        out = target.forward(torch.tensor([ids]), torch.arange(T)[None], cache, tap_layer_ids=(1, 27),
                             logit_rows=torch.tensor([[T - 1]]), prompt=True)
    digests.append(hashlib.md5(out.features[..., :576].float().contiguous().numpy().tobytes()).hexdigest()[:8])
print("first", digests[0], "second", digests[1])
