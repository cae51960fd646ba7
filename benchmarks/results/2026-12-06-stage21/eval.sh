#!/bin/bash
# Online tau of the continuation (runs/stage21/run/draft) against stage 20, then shipped, in one session; then both
# drafts' q4 chains.
cd /work/main && . .venv/bin/activate
S20=${SHIPPED20:-/tmp/shipped20/blockdraft/drafts/smollm2-135m-instruct}
benchmarks/compare_drafts.sh runs/stage21/run/draft runs/stage21/eval $S20
for d in $S20 runs/stage21/run/draft; do
  blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 --weights q4 \
    --draft $d | tail -1
done > runs/stage21/eval/q4-chain.jsonl
