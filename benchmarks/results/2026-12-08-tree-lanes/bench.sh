#!/bin/bash
# Token trees at q4 on an AMD EPYC (Zen 5, AVX512 with native bf16), 2 threads, quiet, after their nodes took the
# slots of their lanes (decode/tree_slots.py): each method against the q4 target alone in the same run, every prompt
# timed by the median of 3 interleaved rounds, both sets; "differ" counts prompts whose text left the target's.
cd "$(dirname "$0")" && . ../../../.venv/bin/activate
for set in humaneval mt-bench; do
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 --weights q4 \
    --methods ours-baseline,blockdraft,blockdraft-tree,blockdraft-lookup --threads 2 --rounds 3 \
    --out $set > $set.txt 2>&1
done
