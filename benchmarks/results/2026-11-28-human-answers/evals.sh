#!/bin/bash
# Online tau of one arm's draft: chain and tree, HumanEval and MT-Bench, 8 prompts, 128 tokens, greedy, bf16.
name=$1
. /work/main/.venv/bin/activate
cd /work/main/runs/abh
while ! grep -q "^done" train-$name.log; do sleep 10; done
blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --weights bf16 --threads 1 \
  --draft train-$name/draft > eval-$name.txt 2>&1
blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --weights bf16 --threads 1 --tree \
  --draft train-$name/draft > eval-$name-tree.txt 2>&1
echo done >> eval-$name-tree.txt
