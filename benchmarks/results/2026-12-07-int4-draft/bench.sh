#!/bin/bash
# The default mode at q4 (`--weights auto` here) against the target alone, same run, both sets, with the draft's
# products int4 beside the int4 target (model/draft_q4.py); the same command as results/2026-12-07-ice-lake/bench.sh
# on the same Ice Lake, so its q4 rows compare with that folder's (bf16 draft, stage 21 both times).
cd "$(dirname "$0")" && . ../../../.venv/bin/activate
for set in humaneval mt-bench; do
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup \
    --threads 2 --out auto-$set > auto-$set.txt 2>&1
done
