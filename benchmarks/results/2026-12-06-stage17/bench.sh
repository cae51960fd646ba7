#!/bin/bash
# The default mode against the target alone (the same run): stage 17 at q4 and bf16 with the n-gram table (copied
# beside the run's draft), then stage 16 (shipped before it, from git) at q4 and bf16.
cd /work/main && . .venv/bin/activate
cp blockdraft/drafts/smollm2-135m-instruct/blockdraft_ngrams.safetensors runs/stage17/run/draft/
benchmarks/bench_default.sh runs/stage17/run/draft runs/stage17/bench
mkdir -p /tmp/s16 && git archive 333f1d3 blockdraft/drafts/smollm2-135m-instruct | tar -x -C /tmp/s16
for w in q4 bf16; do for p in humaneval mt-bench; do
  blockdraft bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup --weights $w \
    --draft /tmp/s16/blockdraft/drafts/smollm2-135m-instruct --threads 2 --out runs/stage17/bench-shipped/$w-$p
done; done
