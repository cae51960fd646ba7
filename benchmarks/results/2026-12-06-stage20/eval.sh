#!/bin/bash
# Online tau of the continuation (runs/stage20/run/draft) against stage 19, then shipped, in one session; then both
# drafts' q4 chains.
cd /work/main && . .venv/bin/activate
S19=${SHIPPED19:-/tmp/shipped19/blockdraft/drafts/smollm2-135m-instruct}
benchmarks/compare_drafts.sh runs/stage20/run/draft runs/stage20/eval $S19
for d in $S19 runs/stage20/run/draft; do
  blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 --weights q4 \
    --draft $d | tail -1
done > runs/stage20/eval/q4-chain.jsonl
