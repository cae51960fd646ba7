#!/bin/bash
# The 8k-head continuation of stage 10 (runs/h8k: ../2026-11-29-head-ids-continuation/train.sh), continued over
# code and greedy answers beside the sampled ones, with the 8k head; the draft forward compiled (--compile auto).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
for f in cpu-code gpu-a; do
  nice -n 10 blockdraft features --data $D/$f --target-layer-ids 1,27 --threads 2 || exit 1
done
exec nice -n 10 blockdraft train --data $D/cpu-code --data $D/gpu-a --data $D/gpu-b --data $D/cpu-s1 --data $D/cpu-s2 \
  --out runs/s11/run --init-from runs/h8k/run/draft --layers 2 --block-size 8 --gamma 4 \
  --target-layer-ids 1,27 --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 --batch-size 8 \
  --micro-batch-size 4 --cpu-autocast --feature-store --time-budget 5100 --save-every 50 --eval-every 300 \
  --save-draft-every-seconds 600 --threads 2
