#!/bin/bash
# The default mode against the target alone (the same run): stage 15 at q4 and bf16 (with the n-gram table), then
# stage 12 (shipped before it) at q4.
cd /work/main && . .venv/bin/activate
benchmarks/bench_default.sh runs/s15/run/draft runs/s15/bench-new
for p in humaneval mt-bench; do
  blockdraft bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup --weights q4 \
    --threads 2 --out runs/s15/bench-shipped/q4-$p
done
