#!/bin/bash
# The default mode against the target alone (the same run), stage 12 shipped (with its n-gram table), q4 then bf16.
cd /work/main && . .venv/bin/activate
DRAFT=${1:-blockdraft/drafts/smollm2-135m-instruct}; OUT=${2:-runs/s12/bench}; mkdir -p $OUT
for w in q4 bf16; do for p in humaneval mt-bench; do
  # Each precision's step costs timed afresh by its first run (a cache from a busier hour prices steps wrong).
  measure=$([ $p = humaneval ] && echo --measure-costs)
  blockdraft bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup --weights $w \
    --draft $DRAFT --threads 2 $measure --out $OUT/$w-$p > $OUT/$w-$p.txt 2>&1
done; done
echo done > $OUT/done
