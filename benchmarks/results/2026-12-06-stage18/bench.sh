#!/bin/bash
# The default mode against the target alone (the same run): stage 18 at q4 and bf16 with the n-gram table (copied
# beside the run's draft), then stage 17 (shipped before it; SHIPPED17: git archive 28a155f
# blockdraft/drafts/smollm2-135m-instruct) at q4 and bf16.
cd /work/main && . .venv/bin/activate
cp blockdraft/drafts/smollm2-135m-instruct/blockdraft_ngrams.safetensors runs/stage18/run/draft/
benchmarks/bench_default.sh runs/stage18/run/draft runs/stage18/bench
S17=${SHIPPED17:-/tmp/shipped17/blockdraft/drafts/smollm2-135m-instruct}
for w in q4 bf16; do for p in humaneval mt-bench; do
  blockdraft bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup --weights $w \
    --draft $S17 --threads 2 --out runs/stage18/bench-shipped/$w-$p
done; done
