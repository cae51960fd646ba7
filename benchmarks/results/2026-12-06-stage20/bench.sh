#!/bin/bash
# The default mode against the target alone (the same run): stage 20 at q4 and bf16 with the n-gram table (copied
# beside the run's draft), then stage 19 (shipped before it; SHIPPED19: git archive 13b95de
# blockdraft/drafts/smollm2-135m-instruct) at q4 and bf16, priced by the same step costs (timed afresh by stage
# 20's first set of each precision; the cost cache is keyed by the draft's shape, not its weights).
cd /work/main && . .venv/bin/activate
cp blockdraft/drafts/smollm2-135m-instruct/blockdraft_ngrams.safetensors runs/stage20/run/draft/
benchmarks/bench_default.sh runs/stage20/run/draft runs/stage20/bench
S19=${SHIPPED19:-/tmp/shipped19/blockdraft/drafts/smollm2-135m-instruct}
for w in q4 bf16; do for p in humaneval mt-bench; do
  blockdraft bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup --weights $w \
    --draft $S19 --threads 2 --out runs/stage20/bench-shipped/$w-$p
done; done
