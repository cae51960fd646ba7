#!/bin/bash
# The capacity A/B at equal CPU time: stage 15 (the shipped draft) continued as it is (2 layers) against stage 15
# grown by one layer (3 layers, the new layer adding nothing at the start), side by side on 1 thread each for the
# same 4,500 s, over the same data in the same order: the greedy folders cpu-a and cpu-b, whose feature
# stores are built first (`blockdraft features --data FOLDER --target-layer-ids 1,27`).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
SHIPPED=${SHIPPED:-blockdraft/drafts/smollm2-135m-instruct}
arm() {  # arm NAME LAYERS [EXTRA FLAGS]
  name=$1; layers=$2; shift 2
  nice -n 10 blockdraft train --data $D/cpu-a --data $D/cpu-b --out runs/s16/$name \
    --init-from "$SHIPPED" --layers $layers "$@" --seed 5 --block-size 8 --gamma 4 --target-layer-ids 1,27 \
    --standardize-features --head-ids 8192 --anchors 96 --lr 2e-4 --batch-size 8 --micro-batch-size 4 \
    --cpu-autocast --feature-store --compile auto --time-budget 4500 --save-every 50 --eval-every 100000 \
    --save-draft-every-seconds 600 --threads 1 > runs/s16/$name.log 2>&1
}
arm two 2 &
arm grown 3 --grow-layers 1 &
wait
