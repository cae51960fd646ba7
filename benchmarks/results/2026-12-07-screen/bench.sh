#!/bin/bash
# The greedy screen (model/screen.py) on the Ice Lake (AVX512 without native bf16), quiet, 2 threads:
# 1. greedy_screen.py: the q4 target alone and the default mode, each with the whole head and screened, alternated
#    in one process: outputs against the whole head's target alone, tokens/s.
# 2. The README's "what runs where" command for this class (results/2026-12-07-ice-lake/bench.sh): the default mode
#    (`--weights auto`: q4 here, screened) against the target alone (screened too), same run, both sets.
cd "$(dirname "$0")" && . ../../../.venv/bin/activate
python ../../greedy_screen.py --weights q4 --limit 4 --max-new-tokens 128 --rounds 2 > greedy-screen-q4.txt 2>&1
for set in humaneval mt-bench; do
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup \
    --threads 2 --out auto-$set > auto-$set.txt 2>&1
done
# 3. Fixed chains of 3 and 4 positions (no lookup, no trees, no adaptive widths), HumanEval, against the target alone
#    in the same run: what the headroom table (headroom-q4-screened.txt) predicts drafted steps alone return.
for k in 3 4; do
  blockdraft bench --prompts humaneval --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft \
    --block-size $k --threads 2 --out chain$k-humaneval > chain$k-humaneval.txt 2>&1
done
# 4. The default mode's parts, HumanEval: adaptive trees without lookup, fixed trees of K, and the default mode.
blockdraft bench --prompts humaneval --limit 8 --max-new-tokens 128 \
  --methods ours-baseline,blockdraft-adaptive,blockdraft-tree,blockdraft-lookup --threads 2 --out modes-humaneval \
  > modes-humaneval.txt 2>&1
