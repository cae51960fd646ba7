#!/bin/bash
# The default mode against the target alone, stage 11 shipped (bench2-5: the q4 reruns in README.md).
cd /work/main && . .venv/bin/activate
OUT=runs/s11/bench; mkdir -p $OUT
for w in q4 bf16; do for p in humaneval mt-bench; do
  blockdraft bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup --weights $w \
    --threads 2 > $OUT/$w-$p.txt 2>&1
done; done
echo done > $OUT/done
