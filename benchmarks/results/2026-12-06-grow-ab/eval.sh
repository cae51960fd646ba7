#!/bin/bash
# Online tau of both arms (runs/s16/two/draft: 2 layers continued; runs/s16/grown/draft: grown to 3) against the
# shipped stage 15, in one session.
cd /work/main && . .venv/bin/activate
benchmarks/compare_drafts.sh runs/s16/two/draft runs/s16/eval blockdraft/drafts/smollm2-135m-instruct \
  runs/s16/grown/draft
