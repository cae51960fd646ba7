#!/bin/bash
# What the draft adds to the q4 default mode on the Ice Lake: the default mode beside the same mode with the draft
# never run (blockdraft-lookup-only), against the target alone, in one run per set (interleaved, each prompt timed by the median of 3 rounds), quiet, 2 threads.
cd "$(dirname "$0")" && . ../../../.venv/bin/activate
for set in humaneval mt-bench; do
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 \
    --methods ours-baseline,blockdraft-lookup,blockdraft-lookup-only --threads 2 --rounds 3 --out share-$set \
    > share-$set.txt 2>&1
done
