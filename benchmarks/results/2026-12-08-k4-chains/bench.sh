#!/bin/bash
# The draft served at K = 4 at q4 on an AMD EPYC (Zen 5, AVX512 with native bf16), 2 threads, quiet: fixed chains
# of 4 positions (blockdraft), the default mode (blockdraft-lookup) and lookup alone, each against the q4 target
# alone in the same run, every prompt timed by the median of 3 interleaved rounds, both sets.
cd "$(dirname "$0")" && . ../../../.venv/bin/activate
for set in humaneval mt-bench; do
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 --weights q4 --block-size 4 \
    --methods ours-baseline,blockdraft,blockdraft-lookup,blockdraft-lookup-only --threads 2 --rounds 3 \
    --out $set > $set.txt 2>&1
done
