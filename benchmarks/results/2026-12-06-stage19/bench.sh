#!/bin/bash
# The default mode against the target alone (the same run): stage 19 at q4 and bf16 with the n-gram table (copied
# beside the run's draft), then stage 18 (shipped before it; SHIPPED18: git archive 7f4373e
# blockdraft/drafts/smollm2-135m-instruct) at q4 and bf16.
cd /work/main && . .venv/bin/activate
cp blockdraft/drafts/smollm2-135m-instruct/blockdraft_ngrams.safetensors runs/stage19/run/draft/
benchmarks/bench_default.sh runs/stage19/run/draft runs/stage19/bench
S18=${SHIPPED18:-/tmp/shipped18/blockdraft/drafts/smollm2-135m-instruct}
for w in q4 bf16; do for p in humaneval mt-bench; do
  blockdraft bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup --weights $w \
    --draft $S18 --threads 2 --out runs/stage19/bench-shipped/$w-$p
done; done
