#!/bin/bash
# Stage 21 (the shipped draft) continued over new human text: human-e's 4,608 last answers of ShareGPT chats no stage
# has trained on (934,744 answer tokens, contexts of up to 1,024 tokens) beside gpu-b's 512 greedy answers (code and
# chat), in a new data order (--seed 12), the stage-15 recipe, 2 threads, on a CPU without native bf16: the draft
# computes in float32 (no --cpu-autocast) and the stores hold a float32 target's features.
# SHIPPED is a copy of stage 21 (git archive f80cedc blockdraft/drafts/smollm2-135m-instruct), so that shipping the
# result cannot change the run's starting point. features.sh builds the stores first.
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
SHIPPED=${SHIPPED:-blockdraft/drafts/smollm2-135m-instruct}
OUT=${OUT:-runs/stage22/run}
exec nice -n 10 blockdraft train --data $D/gpu-b --data $D/human-e --out $OUT \
  --init-from "$SHIPPED" --seed 12 --layers 2 --block-size 8 --gamma 4 --target-layer-ids 1,27 \
  --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 --batch-size 8 --micro-batch-size 4 --feature-store \
  --compile auto \
  --time-budget ${SECONDS_BUDGET:-5400} --save-every 50 --eval-every 100000 --save-draft-every-seconds 600 --threads 2
