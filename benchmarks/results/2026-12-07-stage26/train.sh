#!/bin/bash
# Stage 25 (not shipped; benchmarks/results/2026-12-07-stage25) continued over the same five feature stores (gpu-b,
# cpu-b, cpu-a's last 12 shards, human-e, human-code), --seed 23, the stage-15 recipe, 2 threads, the draft in
# float32 (a CPU without native bf16), stage 21's head ids (kept by stages 24 and 25). At this draft's stage another
# pass over seen answers has given as much per CPU-minute as new ones (docs/training.md §1), so the whole CPU goes
# to training. runs/cpu-a-43-54 is built by the stage-25 train.sh; SHIPPED is a copy of stage 24
# (git archive d15e5f6 blockdraft/drafts/smollm2-135m-instruct | tar -x -C /tmp/shipped24).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
SHIPPED=${SHIPPED:-/tmp/shipped24/blockdraft/drafts/smollm2-135m-instruct}
OUT=${OUT:-runs/stage26/run}
exec nice -n 10 blockdraft train --data $D/gpu-b --data $D/cpu-b --data runs/cpu-a-43-54 --data $D/human-e \
  --data $D/human-code --out $OUT --init-from runs/stage25/run/draft --head-ids-from "$SHIPPED" --seed 23 --layers 2 \
  --block-size 8 --gamma 4 --target-layer-ids 1,27 --standardize-features --anchors 96 --lr 2e-4 --batch-size 8 \
  --micro-batch-size 4 --feature-store --compile auto \
  --time-budget ${SECONDS_BUDGET:-4800} --save-every 50 --eval-every 100000 --save-draft-every-seconds 600 --threads 2
