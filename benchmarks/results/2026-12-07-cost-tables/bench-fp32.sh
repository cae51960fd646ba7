#!/bin/bash
# The float32 row of the README's "what runs where" table on the Ice Lake, with this code's cost tables (timed at
# the first run: widths 3 and 5 and ragged runs of 3 extra too) and the shipped draft (stage 24), quiet, 2 threads.
cd "$(dirname "$0")" && . ../../../.venv/bin/activate
for set in humaneval mt-bench; do
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup \
    --threads 2 --dtype float32 --weights fp32 --out fp32-$set > fp32-$set.txt 2>&1
done
