#!/bin/bash
# Online tau of stage 11 (runs/s11/run/draft) against stage 10, then shipped, in one session: bf16 chains, float32
# chains, trees. Stage 10 is no longer the shipped draft: pass it as the third argument, e.g. a `git archive 3408efe`
# of blockdraft/drafts/smollm2-135m-instruct unpacked in /tmp/s10.
cd /work/main && . .venv/bin/activate
benchmarks/compare_drafts.sh runs/s11/run/draft runs/s11/eval "${1:-/tmp/s10/blockdraft/drafts/smollm2-135m-instruct}"
