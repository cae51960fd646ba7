#!/bin/bash
# Online tau of the continuation (runs/stage22/run/draft) against stage 21, then shipped, in one session; then both
# drafts' q4 chains. SHIPPED21: git archive f80cedc blockdraft/drafts/smollm2-135m-instruct.
cd /work/main && . .venv/bin/activate
S21=${SHIPPED21:-/tmp/shipped21/blockdraft/drafts/smollm2-135m-instruct}
benchmarks/compare_drafts.sh runs/stage22/run/draft runs/stage22/eval $S21
for d in $S21 runs/stage22/run/draft; do
  blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 --weights q4 \
    --draft $d | tail -1
done > runs/stage22/eval/q4-chain.jsonl
