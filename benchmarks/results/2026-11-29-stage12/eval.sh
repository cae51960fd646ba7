#!/bin/bash
# Online tau of the stage-11 continuation (runs/s12/run/draft) against the shipped stage 11, in one session.
cd /work/main && . .venv/bin/activate
benchmarks/compare_drafts.sh runs/s12/run/draft runs/s12/eval
