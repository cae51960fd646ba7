#!/bin/bash
# The two inference-side levers tried beside train.sh (nice 19), stage 18 (SHIPPED18): its block cut to 2, 3 and 4
# positions (one thread), then trees ranked by other scores, with tree-scores.diff applied to a worktree at WT (TREE_T:
# a temperature on the draft's logits; TREE_B: a log bonus per depth). Then draft_cost.py (q4).
. /work/main/.venv/bin/activate
R=/work/main/benchmarks/results/2026-12-06-stage19; WT=${WT:-/tmp/wt}
S18=${SHIPPED18:-/tmp/shipped18/blockdraft/drafts/smollm2-135m-instruct}
run() { nice -n 19 python -m blockdraft.cli eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams \
  --weights bf16 --draft $S18 "$@" | tail -1; }
cd /work/main
for K in 2 3 4; do run --threads 1 --block-size $K > $R/eval-bf16-chain-K$K-shipped.json; done
cd $WT  # python -m puts the working folder first on the path: run from the worktree
for T in 1 0.7 1.5; do TREE_T=$T PYTHONPATH=$WT run --threads 2 --tree > $R/eval-bf16-tree-T$T-shipped.json; done
for B in -0.3 0.3; do TREE_B=$B PYTHONPATH=$WT run --threads 2 --tree > $R/eval-bf16-tree-B$B-shipped.json; done
cd /work/main && python $R/draft_cost.py q4
