#!/bin/bash
# The q4 default mode on an AMD EPYC (Zen 5, AVX512 with native bf16), 2 threads, quiet: before (ea6db73, folded
# attention rows; before-*) and after (token by token; after-*), each against the target alone in the same run,
# every prompt timed by the median of 3 interleaved rounds, both sets. Run from a checkout of each commit.
cd "$(dirname "$0")" && . ../../../.venv/bin/activate
tag=${1:-after}
methods=ours-baseline,blockdraft-lookup,blockdraft-lookup-only
[ "$tag" = after ] && methods=ours-baseline,blockdraft,blockdraft-tree,blockdraft-lookup,blockdraft-lookup-only
for set in humaneval mt-bench; do
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 --methods $methods --threads 2 --rounds 3 \
    --out $tag-$set > $tag-$set.txt 2>&1
done
python block_vs_steps.py q4 folded > block-vs-steps.txt 2>&1
python block_vs_steps.py q4 >> block-vs-steps.txt 2>&1
python forward_time.py > forward-time.txt 2>&1
MKL_CBWR=AUTO,STRICT python folded_rows.py > folded-rows.txt 2>&1
