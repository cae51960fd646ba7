#!/bin/bash
# Stage 24 (the shipped draft) continued with more greedy chat answers: the last 12 of cpu-a's 55 shards (greedy
# answers no stage has seen since stage 17) beside cpu-b's, human-e, gpu-b and human-code, --seed 19, the stage-15
# recipe, 2 threads, the draft in float32 (a CPU without native bf16), stage 21's head ids (kept by stage 24).
# SHIPPED is a copy of stage 24 (git archive d15e5f6 blockdraft/drafts/smollm2-135m-instruct). The 12 shards are
# linked into a folder of their own so that their feature store is built alone (a shard whose store file exists is
# skipped: a stopped build resumes).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
SHIPPED=${SHIPPED:-/tmp/shipped24/blockdraft/drafts/smollm2-135m-instruct}
OUT=${OUT:-runs/stage25/run}
PART=runs/cpu-a-43-54
mkdir -p $PART && ln -sf "$PWD/$D/cpu-a/meta.json" $PART/
for i in $(seq 43 54); do ln -sf "$PWD/$D/cpu-a/data-000$i.safetensors" $PART/; done
nice -n 10 blockdraft features --data $PART --target-layer-ids 1,27 --threads 2 || exit 1
exec nice -n 10 blockdraft train --data $D/gpu-b --data $D/cpu-b --data $PART --data $D/human-e --data $D/human-code \
  --out $OUT --init-from "$SHIPPED" --head-ids-from "$SHIPPED" --seed 19 --layers 2 \
  --block-size 8 --gamma 4 --target-layer-ids 1,27 --standardize-features --anchors 96 --lr 2e-4 --batch-size 8 \
  --micro-batch-size 4 --feature-store --compile auto \
  --time-budget ${SECONDS_BUDGET:-3300} --save-every 50 --eval-every 100000 --save-draft-every-seconds 600 --threads 2
