#!/usr/bin/env bash
# One GPU window (docs/training.md, "One GPU window"): prep, plan and reference here; part I and run on the device.
# `gpu_train.sh --help` and `gpu_train.sh run --help` list every option; lab/gpu_train.py says what each mode does.
# Returned from $OUT by the last call: run.log, summary.json and draft/ (at most 8 files, each < 16 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" lab/gpu_train.py "$@"
