#!/bin/bash
# bf16 weights on an AMD EPYC (Zen 5, AVX512 with native bf16), 2 threads, quiet, after bf16 verify blocks attend
# token by token (before: ../2026-12-08-bf16-vs-q4/), each set's bf16 target alone
# in the same run, every prompt timed by the median of 3 interleaved rounds.
cd "$(dirname "$0")" && . ../../../.venv/bin/activate
for set in humaneval mt-bench; do
  blockdraft bench --prompts $set --limit 8 --max-new-tokens 128 --weights bf16 \
    --methods ours-baseline,blockdraft-lookup,blockdraft-lookup-only --threads 2 --rounds 3 \
    --out $set > $set.txt 2>&1
done
