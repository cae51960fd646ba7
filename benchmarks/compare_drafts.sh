#!/bin/bash
# Online tau of new drafts against the shipped one in one session, as a stage is judged before it ships (greedy,
# 8 prompts each of HumanEval and MT-Bench, 128 new tokens, no n-gram table): bf16 chains, float32 chains, bf16
# trees, each shipped run right before the new ones'. Usage: benchmarks/compare_drafts.sh NEW_DRAFT OUT_DIR
# [SHIPPED_DRAFT [MORE_NEW_DRAFT ...]]; every run's output lands in OUT_DIR/<weights>-<chain|tree>-<name>.txt, the
# names being shipped, new, then new2, new3, ... for the further drafts.
set -euo pipefail
NEW=$1; OUT=$2; SHIP=${3:-blockdraft/drafts/smollm2-135m-instruct}
shift 2; [ $# -gt 0 ] && shift
names=(shipped new); drafts=("$SHIP" "$NEW"); i=2
for more in "$@"; do names+=("new$i"); drafts+=("$more"); i=$((i + 1)); done
mkdir -p "$OUT"
run() { blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 "$@"; }
for mode in "bf16 chain" "fp32 chain" "bf16 tree"; do
  set -- $mode
  tree=$([ "$2" = tree ] && echo --tree || true)
  for j in "${!names[@]}"; do
    run --weights "$1" $tree --draft "${drafts[$j]}" > "$OUT/$1-$2-${names[$j]}.txt" 2>&1
  done
done
for f in "$OUT"/*-shipped.txt; do  # e.g. "bf16-chain  humaneval shipped 1.776 new 1.906  mt-bench shipped ..."
  python - "$f" "${names[@]}" <<'PY'
import json, sys
path, names = sys.argv[1], sys.argv[2:]
runs = {n: json.loads(open(path.replace("-shipped.txt", f"-{n}.txt")).read().strip().splitlines()[-1])["results"]
        for n in names}
line = "  ".join(f"{s} " + " ".join(f"{n} {runs[n][s]['mean_tau']:.3f}" for n in names) for s in runs["shipped"])
print(f"{path.rsplit('/', 1)[-1].removesuffix('-shipped.txt'):11s} {line}")
PY
done
