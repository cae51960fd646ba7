#!/bin/bash
# Online tau of a new draft against the shipped one in one session, as a stage is judged before it ships (greedy,
# 8 prompts each of HumanEval and MT-Bench, 128 new tokens, no n-gram table): bf16 chains, float32 chains, bf16
# trees, each set's shipped run right before the new one's. Usage: benchmarks/compare_drafts.sh NEW_DRAFT OUT_DIR
# [SHIPPED_DRAFT]; every run's output lands in OUT_DIR/<weights>-<chain|tree>-<shipped|new>.txt.
set -euo pipefail
NEW=$1; OUT=$2; SHIP=${3:-blockdraft/drafts/smollm2-135m-instruct}
mkdir -p "$OUT"
run() { blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 "$@"; }
for w in bf16 fp32; do
  run --weights $w --draft "$SHIP" > "$OUT/$w-chain-shipped.txt" 2>&1
  run --weights $w --draft "$NEW" > "$OUT/$w-chain-new.txt" 2>&1
done
run --weights bf16 --tree --draft "$SHIP" > "$OUT/bf16-tree-shipped.txt" 2>&1
run --weights bf16 --tree --draft "$NEW" > "$OUT/bf16-tree-new.txt" 2>&1
for f in "$OUT"/*-new.txt; do
  echo "$(basename "$f" -new.txt): shipped $(tail -1 "${f%-new.txt}-shipped.txt")"
  echo "$(basename "$f" -new.txt): new     $(tail -1 "$f")"
done
