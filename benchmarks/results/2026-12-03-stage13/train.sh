#!/bin/bash
# Stage 12 (blockdraft/drafts/smollm2-135m-instruct) continued over cpu-s3 (1,792 sampled chat and HealthBench
# answers, new to the draft) and two of its own folders (cpu-code, gpu-b: code and greedy answers), 3,425 answers
# in all, in a new data order (--seed 2), compiled. The other folders sit out: on a fresh machine their stores take
# longer to build than this run trains (gpu-a alone, 2.25 M tokens: about 28 minutes on an AMD EPYC Zen 4).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
for f in cpu-s3 cpu-code gpu-b; do
  nice -n 10 blockdraft features --data $D/$f --target-layer-ids 1,27 --threads 2 || exit 1
done
exec nice -n 10 blockdraft train --data $D/cpu-code --data $D/gpu-b --data $D/cpu-s3 \
  --out runs/s13/run --init-from blockdraft/drafts/smollm2-135m-instruct --seed 2 --layers 2 \
  --block-size 8 --gamma 4 --target-layer-ids 1,27 --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 \
  --batch-size 8 --micro-batch-size 4 --cpu-autocast --feature-store --compile auto --time-budget 3300 \
  --save-every 50 --eval-every 2000 --save-draft-every-seconds 600 --threads 2
