#!/bin/bash
# Stage 13 (runs/s13/run/draft, from ../2026-12-03-stage13/train.sh) continued over cpu-s3 (now 2,816 sampled
# answers), cpu-s1 (sampled answers stage 13 did not see), cpu-code and gpu-b, in a new data order (--seed 3),
# compiled, for 5,459 s (the run's own budget: it ended at a set wall-clock time).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
for f in cpu-s3 cpu-s1 cpu-code gpu-b; do
  nice -n 10 blockdraft features --data $D/$f --target-layer-ids 1,27 --threads 2 || exit 1
done
exec nice -n 10 blockdraft train --data $D/cpu-code --data $D/gpu-b --data $D/cpu-s3 --data $D/cpu-s1 \
  --out runs/s14/run --init-from runs/s13/run/draft --seed 3 --layers 2 \
  --block-size 8 --gamma 4 --target-layer-ids 1,27 --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 \
  --batch-size 8 --micro-batch-size 4 --cpu-autocast --feature-store --compile auto --time-budget 5459 \
  --save-every 50 --eval-every 4000 --save-draft-every-seconds 600 --threads 2
