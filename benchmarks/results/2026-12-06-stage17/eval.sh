#!/bin/bash
# Online tau of the continuation (runs/stage17/run/draft) against stage 16, then shipped, in one session.
cd /work/main && . .venv/bin/activate
benchmarks/compare_drafts.sh runs/stage17/run/draft runs/stage17/eval blockdraft/drafts/smollm2-135m-instruct
