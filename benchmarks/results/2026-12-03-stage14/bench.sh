#!/bin/bash
# The default mode against the target alone (the same run), the shipped draft (with its n-gram table), q4 then bf16.
cd /work/main && . .venv/bin/activate
benchmarks/bench_default.sh "${1:-blockdraft/drafts/smollm2-135m-instruct}" "${2:-runs/s14/bench}"
