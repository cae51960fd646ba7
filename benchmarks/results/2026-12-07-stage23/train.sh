#!/bin/bash
# Stage 22 (benchmarks/results/2026-12-07-stage22/draft) continued over human-written code no stage has trained on
# (human-code, data.sh) beside human-e's chat answers and gpu-b's greedy ones, --seed 13, the stage-15 recipe, 2
# threads, the draft in float32 (a CPU without native bf16). The head keeps stage 21's 8,192 ids (--head-ids-from
# the shipped draft) rather than taking the most frequent of this code-heavy mix. SHIPPED is a copy of stage 21
# (git archive f80cedc blockdraft/drafts/smollm2-135m-instruct).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
SHIPPED=${SHIPPED:-/tmp/shipped21/blockdraft/drafts/smollm2-135m-instruct}
OUT=${OUT:-runs/stage23/run}
exec nice -n 10 blockdraft train --data $D/gpu-b --data $D/human-e --data $D/human-code --out $OUT \
  --init-from benchmarks/results/2026-12-07-stage22/draft --head-ids-from "$SHIPPED" --seed 13 --layers 2 \
  --block-size 8 --gamma 4 --target-layer-ids 1,27 --standardize-features --anchors 96 --lr 2e-4 --batch-size 8 \
  --micro-batch-size 4 --feature-store --compile auto \
  --time-budget ${SECONDS_BUDGET:-4200} --save-every 50 --eval-every 100000 --save-draft-every-seconds 600 --threads 2
