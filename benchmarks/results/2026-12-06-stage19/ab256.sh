#!/bin/bash
. /work/main/.venv/bin/activate; cd /tmp/wt
D=/work/main/runs/stage19/run/draft
for p in humaneval mt-bench; do
  measure=$([ $p = humaneval ] && echo --measure-costs || true)
  PYTHONPATH=/tmp/wt python -m blockdraft.cli bench --prompts $p --limit 8 --max-new-tokens 128 --methods ours-baseline,blockdraft-lookup --weights q4 \
    --draft $D --threads 2 $measure --out /work/main/runs/stage19/ab256/q4-$p > /work/main/runs/stage19/ab256/q4-$p.txt 2>&1
done
