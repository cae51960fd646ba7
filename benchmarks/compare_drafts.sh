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
for f in "$OUT"/*-new.txt; do  # e.g. "bf16-chain  humaneval shipped 1.776 new 1.906  mt-bench shipped ..."
  python - "${f%-new.txt}-shipped.txt" "$f" <<'PY'
import json, sys
shipped, new = (json.loads(open(path).read().strip().splitlines()[-1])["results"] for path in sys.argv[1:])
line = "  ".join(f"{s} shipped {shipped[s]['mean_tau']:.3f} new {new[s]['mean_tau']:.3f}" for s in shipped)
print(f"{sys.argv[2].rsplit('/', 1)[-1].removesuffix('-new.txt'):11s} {line}")
PY
done
