#!/bin/bash
# Online tau of the continuation (runs/stage18/run/draft) against stage 17, then shipped, in one session.
cd /work/main && . .venv/bin/activate
benchmarks/compare_drafts.sh runs/stage18/run/draft runs/stage18/eval /tmp/shipped17/blockdraft/drafts/smollm2-135m-instruct
