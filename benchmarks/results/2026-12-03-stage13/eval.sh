#!/bin/bash
# Online tau of the stage-12 continuation (runs/s13/run/draft) against the shipped stage 12, in one session.
cd /work/main && . .venv/bin/activate
benchmarks/compare_drafts.sh runs/s13/run/draft runs/s13/eval
