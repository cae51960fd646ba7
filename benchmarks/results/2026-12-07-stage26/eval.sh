#!/bin/bash
# Online tau of stage 26 (runs/stage26/run/draft) against stage 24, the shipped draft, in one session (greedy, 8
# prompts each, 128 new tokens, K = 8, no n-gram table): bf16 chains, bf16 trees of 8 nodes, q4 chains, the shipped
# draft's run right before the new one's.
cd /work/main && . .venv/bin/activate
S24=${SHIPPED24:-/tmp/shipped24/blockdraft/drafts/smollm2-135m-instruct}
OUT=runs/stage26/eval; mkdir -p $OUT
run() { blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 "$@"; }
for mode in "bf16 chain" "bf16 tree" "q4 chain"; do
  set -- $mode
  tree=$([ "$2" = tree ] && echo --tree || true)
  for pair in "shipped $S24" "new runs/stage26/run/draft"; do
    set -- $mode $pair
    [ -s "$OUT/$1-$2-$3.txt" ] || run --weights "$1" $tree --draft "$4" > "$OUT/$1-$2-$3.txt" 2>&1
  done
done
# Then q4 trees of 8 nodes (the served mode at the default weights), the same pair in the same order.
for pair in "shipped $S24" "new runs/stage26/run/draft"; do
  set -- q4 tree $pair
  [ -s "$OUT/$1-$2-$3.txt" ] || run --weights q4 --tree --draft "$4" > "$OUT/$1-$2-$3.txt" 2>&1
done
