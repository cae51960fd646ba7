#!/bin/bash
# The README's "what runs where" row for AVX512 without native bf16, on a real chip of that class (Intel Ice Lake):
# the default mode (`--weights auto`: q4 here) and `--dtype float32` against the target alone, same run, both sets.
cd "$(dirname "$0")" && . ../../../.venv/bin/activate
for set in humaneval mt-bench; do
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup \
    --threads 2 --out auto-$set > auto-$set.txt 2>&1
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup \
    --threads 2 --dtype float32 --weights fp32 --out fp32-$set > fp32-$set.txt 2>&1
done
