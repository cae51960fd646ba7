#!/bin/bash
# Stage 11 (blockdraft/drafts/smollm2-135m-instruct) continued over the same five folders in a new data order
# (--seed 1), compiled (--compile auto), with the rare held-out evaluations the last run asked for.
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
for f in cpu-code gpu-a gpu-b cpu-s1 cpu-s2; do
  nice -n 10 blockdraft features --data $D/$f --target-layer-ids 1,27 --threads 2 || exit 1
done
exec nice -n 10 blockdraft train --data $D/cpu-code --data $D/gpu-a --data $D/gpu-b --data $D/cpu-s1 --data $D/cpu-s2 \
  --out runs/s12/run --init-from blockdraft/drafts/smollm2-135m-instruct --seed 1 --layers 2 --block-size 8 \
  --gamma 4 --target-layer-ids 1,27 --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 --batch-size 8 \
  --micro-batch-size 4 --cpu-autocast --feature-store --time-budget 6300 --save-every 50 --eval-every 1000 \
  --save-draft-every-seconds 600 --threads 2
