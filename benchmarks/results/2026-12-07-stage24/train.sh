#!/bin/bash
# Stage 23 (benchmarks/results/2026-12-07-stage23/draft) continued with chat text in a larger share: cpu-b's greedy
# answers (609,520 response tokens, no stage since 21 has seen them) beside human-e's chat answers, gpu-b, and
# human-code, --seed 17, the stage-15 recipe, 2 threads, the draft in float32 (a CPU without native bf16). The head
# keeps stage 21's 8,192 ids. SHIPPED is a copy of stage 21 (git archive f80cedc
# blockdraft/drafts/smollm2-135m-instruct). Builds cpu-b's feature store first (a shard whose store file exists
# is skipped).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
SHIPPED=${SHIPPED:-/tmp/shipped21/blockdraft/drafts/smollm2-135m-instruct}
OUT=${OUT:-runs/stage24/run}
nice -n 10 blockdraft features --data $D/cpu-b --target-layer-ids 1,27 --threads 2 || exit 1
exec nice -n 10 blockdraft train --data $D/gpu-b --data $D/cpu-b --data $D/human-e --data $D/human-code --out $OUT \
  --init-from benchmarks/results/2026-12-07-stage23/draft --head-ids-from "$SHIPPED" --seed 17 --layers 2 \
  --block-size 8 --gamma 4 --target-layer-ids 1,27 --standardize-features --anchors 96 --lr 2e-4 --batch-size 8 \
  --micro-batch-size 4 --feature-store --compile auto \
  --time-budget ${SECONDS_BUDGET:-3600} --save-every 50 --eval-every 100000 --save-draft-every-seconds 600 --threads 2
