#!/bin/bash
# q4, stage 19 (shipped), this session's cost cache (a drafted width-2 step 1.43 plain steps): the shipped policy and
# stage 18's retry-and-ragged.diff (applied at /tmp/wt), alternating per set.
. /work/main/.venv/bin/activate
O=/work/main/runs/stage19/ragged-ab
for p in humaneval mt-bench; do
  cd /work/main && python -m blockdraft.cli bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup \
    --weights q4 --threads 2 --out $O/shipped-$p > $O/shipped-$p.txt 2>&1
  cd /tmp/wt && PYTHONPATH=/tmp/wt python -m blockdraft.cli bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup \
    --weights q4 --threads 2 --out $O/ragged-$p > $O/ragged-$p.txt 2>&1
done
