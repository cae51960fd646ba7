#!/bin/bash
# The default mode against the target alone (the same run): stage 21 at q4 and bf16 with the n-gram table (copied
# beside the run's draft), then stage 20 (shipped before it; SHIPPED20: git archive 4f96f8d
# blockdraft/drafts/smollm2-135m-instruct) at q4 and bf16, priced by the same step costs (timed afresh by stage
# 21's first set of each precision; the cost cache is keyed by the draft's shape, not its weights).
cd /work/main && . .venv/bin/activate
cp blockdraft/drafts/smollm2-135m-instruct/blockdraft_ngrams.safetensors runs/stage21/run/draft/
benchmarks/bench_default.sh runs/stage21/run/draft runs/stage21/bench
S20=${SHIPPED20:-/tmp/shipped20/blockdraft/drafts/smollm2-135m-instruct}
for w in q4 bf16; do for p in humaneval mt-bench; do
  blockdraft bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup --weights $w \
    --draft $S20 --threads 2 --out runs/stage21/bench-shipped/$w-$p
done; done
