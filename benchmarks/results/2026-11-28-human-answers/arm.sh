#!/bin/bash
# One arm of the data-source A/B: feature store, then 900 s of training on 1 thread.
set -e
name=$1
. /work/main/.venv/bin/activate
cd /work/main/runs/abh
start=$(date +%s.%N)
blockdraft features --data $name --target-layer-ids 1,27 --threads 1 > feat-$name.log 2>&1
echo "features_seconds $(echo "$(date +%s.%N) - $start" | bc)" >> feat-$name.log
blockdraft train --data $name --out train-$name --layers 2 --target-layer-ids 1,27 --anchors 96 --max-seq-len 640 \
  --batch-size 8 --micro-batch-size 4 --seed 13 --cpu-autocast --standardize-features --proposal-vocab \
  --feature-store --time-budget 900 --threads 1 --block-size 4 --gamma 4 --lr 1e-3 > train-$name.log 2>&1
echo done >> train-$name.log
