#!/bin/bash
# Online tau of the stage-15 run (runs/s15/run/draft) against the shipped stage 12, in one session.
cd /work/main && . .venv/bin/activate
benchmarks/compare_drafts.sh runs/s15/run/draft runs/s15/eval
