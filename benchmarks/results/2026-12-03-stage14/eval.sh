#!/bin/bash
# Online tau of the stage-13 continuation (runs/s14/run/draft) against the shipped stage 12, in one session.
cd /work/main && . .venv/bin/activate
benchmarks/compare_drafts.sh runs/s14/run/draft runs/s14/eval
