#!/bin/bash
# Stage 20 (the shipped draft) continued over new text: human-d's 1,600 human answers no stage has trained on
# (shards data-00000 to data-00024, 303,185 answer tokens), beside human-c, human-b, human-a and the greedy folders
# cpu-a and cpu-b, in a new data order (--seed 11), the stage-15 recipe, 2 threads, for 6,600 s of training.
# SHIPPED is a copy of stage 20 (git archive 4f96f8d blockdraft/drafts/smollm2-135m-instruct), so that shipping
# the result cannot change the run's starting point.
# Builds the feature stores first (a shard whose store file exists is skipped).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
SHIPPED=${SHIPPED:-blockdraft/drafts/smollm2-135m-instruct}
for f in human-d human-c human-b human-a cpu-b cpu-a; do
  nice -n 10 blockdraft features --data $D/$f --target-layer-ids 1,27 --threads 2 || exit 1
done
exec nice -n 10 blockdraft train --data $D/cpu-a --data $D/cpu-b --data $D/human-a --data $D/human-b \
  --data $D/human-c --data $D/human-d --out runs/stage21/run --init-from "$SHIPPED" --seed 11 --layers 2 \
  --block-size 8 --gamma 4 --target-layer-ids 1,27 --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 \
  --batch-size 8 --micro-batch-size 4 --cpu-autocast --feature-store --compile auto --time-budget 6600 \
  --save-every 50 --eval-every 100000 --save-draft-every-seconds 600 --threads 2
