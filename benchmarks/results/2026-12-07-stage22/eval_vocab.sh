#!/bin/bash
# Stage 22 scored over stage 21's 8,192 head ids (its weights, stage 21's blockdraft_vocab.json): bf16 chain, bf16
# trees (then q4 and float32 chains, stopped unfinished this time), as eval.sh runs them, to part what training
# taught from what the new ids changed.
cd /work/main && . .venv/bin/activate
S21=${SHIPPED21:-/tmp/shipped21/blockdraft/drafts/smollm2-135m-instruct}
D=runs/stage22/oldvocab
mkdir -p $D && cp runs/stage22/run/draft/{config.json,model.safetensors} $S21/blockdraft_vocab.json $D/
run() {
  blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 --draft $D "$@"
}
run --weights bf16 | tail -1 > runs/stage22/eval/bf16-chain-oldvocab.txt
run --weights bf16 --tree | tail -1 > runs/stage22/eval/bf16-tree-oldvocab.txt
run --weights q4 | tail -1 > runs/stage22/eval/q4-chain-oldvocab.txt
run --weights fp32 | tail -1 > runs/stage22/eval/fp32-chain-oldvocab.txt
