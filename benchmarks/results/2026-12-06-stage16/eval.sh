#!/bin/bash
# Online tau of the continuation (runs/stage16/run/draft) against stage 15, then shipped, in one session.
cd /work/main && . .venv/bin/activate
benchmarks/compare_drafts.sh runs/stage16/run/draft runs/stage16/eval blockdraft/drafts/smollm2-135m-instruct
