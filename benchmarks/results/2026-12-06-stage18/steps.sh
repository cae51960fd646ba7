#!/bin/bash
# Where the q4 default mode's steps go, and two changes to the tree policy tried (neither shipped; retry-and-ragged.diff
# holds both). With the diff applied to a worktree at WT (PYTHONPATH=$WT runs it): the three-arm A/B (policy_ab.py;
# its first version, run before bench.sh, had arms before / after = re-try only: policy-ab-q4-stage17.txt with stage
# 17 and its table, policy-ab-q4-stage18-no-table.txt with stage 18 before its table was copied beside it), then
# benchmarks/step_truth.py with each; and q4 chains of both drafts (eval-q4-chain-*.json).
cd /work/main && . .venv/bin/activate
R=benchmarks/results/2026-12-06-stage18; WT=${WT:-/tmp/wt}
PYTHONPATH=$WT python $R/policy_ab.py q4 runs/stage18/run/draft > $R/policy-ab-q4-three-arms.txt 2>&1
for p in humaneval mt-bench; do  # stage 17 (shipped then), the re-try change alone (ran before the other): truth-q4-*.txt
  PYTHONPATH=$WT python benchmarks/step_truth.py --weights q4 --prompts $p --threads 2 > $R/truth-q4-$p.txt 2>&1
done
python benchmarks/step_truth.py --weights q4 --prompts humaneval --draft runs/stage18/run/draft  # without them
PYTHONPATH=$WT python benchmarks/step_truth.py --weights q4 --prompts humaneval --draft runs/stage18/run/draft
for d in shipped runs/stage18/run/draft; do
  blockdraft eval --prompts humaneval,mt-bench --limit 8 --max-new-tokens 128 --no-ngrams --threads 2 --weights q4 \
    $([ $d != shipped ] && echo --draft $d) | tail -1
done
