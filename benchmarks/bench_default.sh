#!/bin/bash
# The default mode against the target alone in one run per set and precision, as a stage is benched before it
# ships (greedy, 8 prompts each of HumanEval and MT-Bench, 128 new tokens, the draft with its n-gram table), q4 then
# bf16; each precision's step costs timed afresh by its first run (a cache from a busier hour prices steps wrong).
# Usage: benchmarks/bench_default.sh [DRAFT] [OUT_DIR]; every run lands in OUT_DIR/<weights>-<set>{.txt,/}.
set -euo pipefail
DRAFT=${1:-blockdraft/drafts/smollm2-135m-instruct}; OUT=${2:-bench-out/default}
mkdir -p "$OUT"
for w in q4 bf16; do for p in humaneval mt-bench; do
  measure=$([ $p = humaneval ] && echo --measure-costs || true)
  blockdraft bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup --weights $w \
    --draft "$DRAFT" --threads 2 $measure --out "$OUT/$w-$p" > "$OUT/$w-$p.txt" 2>&1
done; done
