#!/bin/bash
# One draft (DRAFT), one cost cache: the shipped policy (/work/main) against ragged-first.diff (applied at /tmp/wt:
# a tree step becomes the rows' lookup runs on a plain step where that is expected to commit tokens faster), one
# after the other per set; q4 in two rounds of opposite orders, then bf16 in one.
. /work/main/.venv/bin/activate
DRAFT=${DRAFT:-/work/main/runs/stage20/run/draft}
O=/work/main/runs/stage20/ragged-ab; mkdir -p $O
for run in "q4 1" "q4 2" "bf16 1"; do set -- $run; w=$1; round=$2
  for p in humaneval mt-bench; do
    arms=$([ $round = 1 ] && echo "shipped ragged" || echo "ragged shipped")
    for arm in $arms; do
      dir=$([ $arm = shipped ] && echo /work/main || echo /tmp/wt)
      cd $dir && PYTHONPATH=$dir python -m blockdraft.cli bench --prompts $p --limit 8 --max-new-tokens 128 \
        --methods ours-baseline,blockdraft-lookup --weights $w --threads 2 --draft $DRAFT \
        --out $O/$arm-$w-$p-$round > $O/$arm-$w-$p-$round.txt 2>&1
    done
  done
done
