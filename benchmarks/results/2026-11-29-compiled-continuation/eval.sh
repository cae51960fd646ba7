#!/bin/bash
# Online tau of stage 11 (runs/s11/run/draft) against stage 10, then shipped, in one session: bf16 chains, float32
# chains, trees.
cd /work/main && . .venv/bin/activate
NEW=runs/s11/run/draft; SHIP=blockdraft/drafts/smollm2-135m-instruct; OUT=runs/s11/eval; mkdir -p $OUT
run() { blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 "$@"; }
for w in bf16 fp32; do
  run --weights $w --draft $SHIP > $OUT/$w-chain-shipped.txt 2>&1
  run --weights $w --draft $NEW > $OUT/$w-chain-new.txt 2>&1
done
run --weights bf16 --tree --draft $SHIP > $OUT/bf16-tree-shipped.txt 2>&1
run --weights bf16 --tree --draft $NEW > $OUT/bf16-tree-new.txt 2>&1
echo done > $OUT/done
