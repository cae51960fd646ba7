#!/bin/bash
# Stage 12 (the shipped draft) continued over the greedy folders no stage has trained on since stage 10 (cpu-a,
# cpu-b) beside cpu-s3's sampled chat answers, cpu-code and gpu-b, in a new data order (--seed 4), compiled, for
# 6,300 s of training. Builds the feature stores first (about 20 minutes on a 2-core Xeon).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
for f in cpu-s3 cpu-code gpu-b cpu-b cpu-a; do
  nice -n 10 blockdraft features --data $D/$f --target-layer-ids 1,27 --threads 2 || exit 1
done
exec nice -n 10 blockdraft train --data $D/cpu-a --data $D/cpu-b --data $D/cpu-s3 --data $D/cpu-code --data $D/gpu-b \
  --out runs/s15/run --init-from blockdraft/drafts/smollm2-135m-instruct --seed 4 --layers 2 --block-size 8 \
  --gamma 4 --target-layer-ids 1,27 --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 --batch-size 8 \
  --micro-batch-size 4 --cpu-autocast --feature-store --compile auto --time-budget 6300 --save-every 50 \
  --eval-every 4000 --save-draft-every-seconds 600 --threads 2
