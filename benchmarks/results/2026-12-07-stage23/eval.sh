#!/bin/bash
# Online tau of stage 23 (runs/stage23/run/draft) and stage 22 against stage 21, the shipped draft, in one session:
# bf16 chains, float32 chains, bf16 trees (compare_drafts.sh), then the three drafts' q4 chains.
cd /work/main && . .venv/bin/activate
S21=${SHIPPED21:-/tmp/shipped21/blockdraft/drafts/smollm2-135m-instruct}
S22=benchmarks/results/2026-12-07-stage22/draft
benchmarks/compare_drafts.sh runs/stage23/run/draft runs/stage23/eval $S21 $S22
for d in $S21 runs/stage23/run/draft $S22; do
  blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 --weights q4 \
    --draft $d | tail -1
done > runs/stage23/eval/q4-chain.jsonl
