#!/bin/bash
# Stage 19 (the shipped draft) continued over new text: the 736 human answers of human-c no stage has trained on
# (shards data-00051 to data-00062, 143,321 answer tokens), beside the rest of human-c, human-b, human-a and the
# greedy folders cpu-a and cpu-b, in a new data order (--seed 10), the stage-15 recipe, 2 threads, for 4,800 s of
# training.
# SHIPPED is a copy of stage 19 (git archive 13b95de blockdraft/drafts/smollm2-135m-instruct), so that shipping
# the result cannot change the run's starting point.
# Builds the feature stores first (a shard whose store file exists is skipped).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
SHIPPED=${SHIPPED:-blockdraft/drafts/smollm2-135m-instruct}
for f in human-c human-b human-a cpu-b cpu-a; do
  nice -n 10 blockdraft features --data $D/$f --target-layer-ids 1,27 --threads 2 || exit 1
done
exec nice -n 10 blockdraft train --data $D/cpu-a --data $D/cpu-b --data $D/human-a --data $D/human-b \
  --data $D/human-c --out runs/stage20/run --init-from "$SHIPPED" --seed 10 --layers 2 --block-size 8 --gamma 4 \
  --target-layer-ids 1,27 --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 --batch-size 8 \
  --micro-batch-size 4 --cpu-autocast --feature-store --compile auto --time-budget 4800 --save-every 50 \
  --eval-every 100000 --save-draft-every-seconds 600 --threads 2
