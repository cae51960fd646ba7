#!/bin/bash
# Online tau of the continuation against the then shipped draft (stage 10), same session: bf16 chains, then float32
# chains, then trees. Stage 10 is no longer shipped: pass it as the first argument, e.g. a `git archive 3408efe` of
# blockdraft/drafts/smollm2-135m-instruct unpacked in /tmp/s10.
cd /work/main && . .venv/bin/activate
benchmarks/compare_drafts.sh runs/h8k/run/draft runs/h8k/eval "${1:-/tmp/s10/blockdraft/drafts/smollm2-135m-instruct}"
