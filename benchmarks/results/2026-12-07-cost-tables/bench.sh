#!/bin/bash
# The default mode at q4 on the Ice Lake (AVX512 without native bf16), quiet, 2 threads, with cost tables timed by
# this code (each cache keyed by the digest of the code a step runs; widths 3 and 5 and ragged runs of 3 extra
# timed too), against the target alone in the same run, both sets; then what each kind of step returned
# (step_truth.py) and what drafted steps alone could return at each width (headroom.py) with this table.
cd "$(dirname "$0")" && . ../../../.venv/bin/activate
for set in humaneval mt-bench; do
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup \
    --threads 2 --out auto-$set > auto-$set.txt 2>&1
done
python ../../step_truth.py --weights q4 --prompts humaneval --limit 8 --threads 2 > step-truth-humaneval.txt 2>&1
KEY=$(ls -t ~/.cache/blockdraft/costs/*.json | head -1)  # the q4 tree table the runs above timed
cp "$KEY" costs-q4-trees.json
python ../../headroom.py --eval ../2026-12-07-stage26/eval/q4-chain-shipped.json --costs costs-q4-trees.json \
  --goal 1.3 > headroom-q4.txt 2>&1
