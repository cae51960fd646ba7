#!/bin/bash
# Stage 15 (the shipped draft) continued over new text: the human answers no stage has trained on (human-b, with
# contexts of up to 1,024 tokens, and the last 1,350 of human-a) beside the rest of human-a and the greedy folders
# cpu-a and cpu-b, in a new data order (--seed 6), the stage-15 recipe, 2 threads, for 4,500 s of training.
# Stage 16 read human-b's first 37 shards (data-00000 to data-00036); the folder has grown since, so move the later
# shards and their store files aside to train on the same answers.
# Builds the feature stores first (a shard whose store file exists is skipped; human-b and human-a took 8 + 17
# minutes on a 2-core Xeon, cpu-b and cpu-a 6 + 29).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
SHIPPED=${SHIPPED:-blockdraft/drafts/smollm2-135m-instruct}
for f in human-b human-a cpu-b cpu-a; do
  nice -n 10 blockdraft features --data $D/$f --target-layer-ids 1,27 --threads 2 || exit 1
done
exec nice -n 10 blockdraft train --data $D/cpu-a --data $D/cpu-b --data $D/human-a --data $D/human-b \
  --out runs/stage16/run --init-from "$SHIPPED" --seed 6 --layers 2 --block-size 8 --gamma 4 --target-layer-ids 1,27 \
  --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 --batch-size 8 --micro-batch-size 4 \
  --cpu-autocast --feature-store --compile auto --time-budget 4500 --save-every 50 --eval-every 100000 \
  --save-draft-every-seconds 600 --threads 2
