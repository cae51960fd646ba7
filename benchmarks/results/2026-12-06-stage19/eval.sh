#!/bin/bash
# Online tau of the continuation (runs/stage19/run/draft) against stage 18, then shipped, in one session; then both
# drafts' q4 chains.
cd /work/main && . .venv/bin/activate
S18=${SHIPPED18:-/tmp/shipped18/blockdraft/drafts/smollm2-135m-instruct}
benchmarks/compare_drafts.sh runs/stage19/run/draft runs/stage19/eval $S18
for d in $S18 runs/stage19/run/draft; do
  blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 --weights q4 \
    --draft $d | tail -1
done > runs/stage19/eval/q4-chain.jsonl
