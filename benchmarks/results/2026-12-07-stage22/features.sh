#!/bin/bash
# The feature stores stage 22 reads (float32 target on this CPU; a shard whose store file exists is skipped).
cd /work/main && . .venv/bin/activate
D=datasets/smollm2-135m-instruct
for f in human-e gpu-b; do
  nice -n 10 blockdraft features --data $D/$f --target-layer-ids 1,27 --threads 2 || exit 1
done
