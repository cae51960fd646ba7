#!/bin/bash
# human-code: each codeio-functions prompt with its record's own code sample as the answer (codeio-answers), the
# target's greedy labels and its float32 features at taps 1 and 27 from one prefill (no `blockdraft features` pass).
# Contexts up to 384 tokens, answers cut at 512. Resumable: the same command continues.
cd /work/main && . .venv/bin/activate
exec nice -n 10 blockdraft data --human-answers --sets codeio-answers --out datasets/smollm2-135m-instruct/human-code \
  --count 3002 --max-prompt-tokens 384 --max-new-tokens 512 --batch-size 8 --shard-size 64 --threads 2 \
  --store-features 1,27
