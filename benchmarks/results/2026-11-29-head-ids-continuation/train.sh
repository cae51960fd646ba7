#!/bin/bash
# Continuation of the shipped draft (K = 8 as served) with a head over the 8,192 most frequent ids, from the stores.
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
for f in gpu-b cpu-s1 cpu-s2; do nice -n 10 blockdraft features --data $D/$f --target-layer-ids 1,27 --threads 2 || exit 1; done
exec nice -n 10 blockdraft train --data $D/human-a --data $D/gpu-b --data $D/cpu-s1 --data $D/cpu-s2 \
  --out runs/h8k/run --init-from blockdraft/drafts/smollm2-135m-instruct --layers 2 --block-size 8 --gamma 4 \
  --target-layer-ids 1,27 --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 --batch-size 8 \
  --micro-batch-size 4 --cpu-autocast --feature-store --time-budget 4500 --save-every 50 --eval-every 300 \
  --save-draft-every-seconds 600 --threads 2
