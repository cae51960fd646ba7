"""The SmolLM2 draft's online chain tau against the CPU-hours and the distinct response tokens its lineage trained on.

    python benchmarks/tau_vs_data.py [--out benchmarks/smollm2-tau-vs-data.png]

Each filled point is one training stage of the shipped draft (stages 1-9, docs/history.md §4), each continuing the
last; hollow points are continuations that were measured and not shipped (from stage 9; after the star one from
stage 10, stages 13 and 14 from stage 12, and 2L and 3L from stage 15, continued and grown by a layer); the star is
stage 10, 7 minutes on one GPU (docs/training.md §8.3), drawn at the lineage's CPU-hours (it added none); stages 11,
12 and 15-19 continue it on the CPU. x: the CPU-hours of training of the lineage up to that point (2 cores; data
generation not counted), and the distinct target-regenerated response tokens of every data folder trained on; y:
online greedy chain tau (K=8, 8 prompts, 128 new tokens) on HumanEval and MT-Bench first turns. Stages 3 and 4 were
measured in float32 on another CPU, the rest in bf16.
The last lines print what the late slope says about the 2.0 / 1.7 targets.
"""

from __future__ import annotations

import argparse

# stage: (training minutes of the stage, cumulative response tokens, HumanEval tau, MT-Bench tau)
STAGES = {
    "1": (46, 100_727, 1.134, 1.189),
    "2": (55, 407_661, 1.186, 1.250),
    "3": (50, 661_027, 1.220, 1.250),
    "4": (60, 1_031_038, 1.254, 1.271),
    "5": (60, 1_272_140, 1.373, 1.308),
    "6": (21, 1_729_734, 1.380, 1.329),
    "7": (38, 1_957_204, 1.444, 1.334),
    "8": (64, 2_359_923, 1.497, 1.337),
    "9": (65, 2_486_649, 1.529, 1.348),
}
# Continuations of stage 9, not shipped: (their own minutes, cumulative tokens, HumanEval tau, MT-Bench tau, label)
NOT_SHIPPED = [
    (76, 2_486_649, 1.495, 1.355, "same data"),
    (30, 2_943_950, 1.533, 1.351, "+2.3k seqs"),
    (28, 3_648_995, 1.534, 1.357, "cpu-a 5.9k"),
    # 2026-11-27: all three folders (17,041 distinct prompts), 628 steps of 8 (5,024 sequences, 29 % of them),
    # 100 minutes beside other work; the shipped draft measured 1.514 / 1.342 in the same run.
    (100, 3_500_000, 1.543, 1.366, "3 folders"),
]
# Stages trained on a GPU: (GPU minutes, cumulative tokens, HumanEval tau, MT-Bench tau). Stage 10 (2026-11-28):
# from stage 9, 430 s on one H200, 1,440 steps of 32 sequences over the four folders of 20,096 distinct prompts;
# measured on the CPU beside stage 9 (1.514 / 1.342 in the same run).
GPU_STAGES = {"10": (7.2, 4_071_399, 1.622, 1.419)}
# Later continuations, not shipped: (CPU minutes since stage 10, tokens added since, HumanEval tau, MT-Bench tau,
# label). 2026-11-29 (Intel Xeon): stage 10 continued 75 minutes with --head-ids 8192 over human-a, gpu-b, cpu-s1,
# cpu-s2 (2.71 M supervised tokens: human answers and sampled ones), measured beside stage 10 in one run (bf16: 1.689 /
# 1.415 against 1.701 / 1.377); drawn as stage 10's own point plus that difference, the CPU of the two runs being
# another. The later ones are added below, after the shipped stages they continue.
AFTER_GPU = [(75, 2_710_801, 1.622 + 1.689 - 1.701, 1.419 + 1.415 - 1.377, "from 10: 8k head, 75 min")]
# Shipped stages after stage 10: (CPU minutes since stage 10, tokens added, HumanEval tau, MT-Bench tau). Stage 11
# (2026-11-29, Intel Xeon): the 75-minute continuation above, then 85 minutes more with the forward compiled over
# code, greedy and sampled answers (no new text); measured beside stage 10 in one run (bf16: 1.776 / 1.449 against
# 1.682 / 1.377), drawn as stage 10's point plus that difference. Stage 12 (2026-11-29, the same Intel Xeon): stage 11
# continued 106 minutes over the same folders (no new text); measured beside stage 11 in one run (bf16: 1.906 / 1.479
# against 1.776 / 1.449), drawn as stage 11's point plus that difference.
SHIPPED_AFTER_GPU = {"11": (160, 2_710_801, 1.622 + 1.776 - 1.682, 1.419 + 1.449 - 1.377)}
SHIPPED_AFTER_GPU["12"] = (160 + 106, 2_710_801, SHIPPED_AFTER_GPU["11"][2] + 1.906 - 1.776,
                           SHIPPED_AFTER_GPU["11"][3] + 1.479 - 1.449)
# Stage 13 (2026-12-03, AMD EPYC Zen 4): stage 12 continued 54 minutes over cpu-s3 (its first 7 shards: 1,792
# sampled answers, 345,551 new response tokens), cpu-code, gpu-b; measured beside stage 12 in one run (bf16: 1.824 /
# 1.481 against 1.792 / 1.490), drawn as stage 12's point plus that difference. Not shipped (MT-Bench lower).
AFTER_GPU.append((160 + 106 + 54, 2_710_801 + 345_551, SHIPPED_AFTER_GPU["12"][2] + 1.824 - 1.792,
                  SHIPPED_AFTER_GPU["12"][3] + 1.481 - 1.490, "13"))
# Stage 14 (the same day and CPU): stage 13 continued 91 minutes over all of cpu-s3 (11 shards: 191,985 more new
# response tokens), cpu-s1, cpu-code, gpu-b; beside stage 12 in one run (bf16: 1.847 / 1.488 against 1.792 / 1.490).
# Not shipped (MT-Bench lower by 0.002).
AFTER_GPU.append((160 + 106 + 54 + 91, 2_710_801 + 537_536, SHIPPED_AFTER_GPU["12"][2] + 1.847 - 1.792,
                  SHIPPED_AFTER_GPU["12"][3] + 1.488 - 1.490, "14"))

# Stage 15 (2026-12-04, Intel Xeon): stage 12 continued 105 minutes over cpu-a, cpu-b (greedy, trained on before stage
# 10), cpu-s3 (its 537,536 new response tokens), cpu-code, gpu-b; beside stage 12 in one run (bf16: 1.939 / 1.526
# against 1.906 / 1.479). Shipped.
SHIPPED_AFTER_GPU["15"] = (160 + 106 + 105, 2_710_801 + 537_536, SHIPPED_AFTER_GPU["12"][2] + 1.939 - 1.906,
                           SHIPPED_AFTER_GPU["12"][3] + 1.526 - 1.479)

# 2026-12-06 (Intel Xeon): stage 15 continued as it is and grown by a third layer, side by side on 1 thread each for
# 75 minutes (38 minutes of the 2-core machine each) over cpu-a and cpu-b (no new text); beside stage 15 in one run
# (bf16: 1.963 / 1.523 and 1.943 / 1.526 against 1.939 / 1.526). Neither shipped.
for label, humaneval, mt_bench in (("2L", 1.963, 1.523), ("3L", 1.943, 1.526)):
    AFTER_GPU.append((160 + 106 + 105 + 38, 2_710_801 + 537_536, SHIPPED_AFTER_GPU["15"][2] + humaneval - 1.939,
                      SHIPPED_AFTER_GPU["15"][3] + mt_bench - 1.526, label))


# Stage 16 (2026-12-06, the same Intel Xeon): stage 15 continued 75 minutes (2 threads) over new text, the human
# answers of human-b (374,528 answer tokens, contexts of up to 1,024 tokens) and the last 1,350 of human-a (243,293),
# beside the rest of human-a and the greedy cpu-a and cpu-b; beside stage 15 in one run (bf16: 1.975 / 1.530 against
# 1.939 / 1.526). Shipped.
SHIPPED_AFTER_GPU["16"] = (160 + 106 + 105 + 75, 2_710_801 + 537_536 + 374_528 + 243_293,
                           SHIPPED_AFTER_GPU["15"][2] + 1.975 - 1.939, SHIPPED_AFTER_GPU["15"][3] + 1.530 - 1.526)


# Stage 17 (2026-12-06, the same Intel Xeon): stage 16 continued 90 minutes (2 threads) over the 3,776 human answers of
# human-b it had not seen (771,859 answer tokens) beside the rest of human-b, human-a, cpu-a and cpu-b; beside stage 16
# in one run (bf16: 1.982 / 1.549 against 1.975 / 1.530). Shipped.
SHIPPED_AFTER_GPU["17"] = (160 + 106 + 105 + 75 + 90, SHIPPED_AFTER_GPU["16"][1] + 771_859,
                           SHIPPED_AFTER_GPU["16"][2] + 1.982 - 1.975, SHIPPED_AFTER_GPU["16"][3] + 1.549 - 1.530)


# Stage 18 (2026-12-06, the same Intel Xeon): stage 17 continued 90 minutes (2 threads) over the last 1,856 human answers
# of human-b (441,036 answer tokens) and human-c's 1,728 (319,888, contexts of up to 2,048 tokens) beside the rest;
# beside stage 17 in one run (bf16: 1.985 / 1.568 against 1.982 / 1.549). Shipped.
SHIPPED_AFTER_GPU["18"] = (160 + 106 + 105 + 75 + 90 + 90, SHIPPED_AFTER_GPU["17"][1] + 441_036 + 319_888,
                           SHIPPED_AFTER_GPU["17"][2] + 1.985 - 1.982, SHIPPED_AFTER_GPU["17"][3] + 1.568 - 1.549)


# Stage 19 (2026-12-06, the same Intel Xeon): stage 18 continued 90 minutes (2 threads; 2,717 steps, evaluations ran
# beside its first 50 minutes) over human-c's 1,536 answers no stage had seen (315,193 answer tokens) beside the rest;
# beside stage 18 in one run (bf16: 2.000 / 1.597 against 1.985 / 1.568). Shipped.
SHIPPED_AFTER_GPU["19"] = (160 + 106 + 105 + 75 + 90 + 90 + 90, SHIPPED_AFTER_GPU["18"][1] + 315_193,
                           SHIPPED_AFTER_GPU["18"][2] + 2.000 - 1.985, SHIPPED_AFTER_GPU["18"][3] + 1.597 - 1.568)


# Stage 20 (2026-12-06, the same Intel Xeon): stage 19 continued 80 minutes (2 threads; 2,606 steps, nothing beside it)
# over human-c's last 736 answers (143,321 answer tokens) beside the rest; beside stage 19 in one run (bf16: 2.018 /
# 1.615 against 2.000 / 1.597). Shipped.
SHIPPED_AFTER_GPU["20"] = (160 + 106 + 105 + 75 + 90 + 90 + 90 + 80, SHIPPED_AFTER_GPU["19"][1] + 143_321,
                           SHIPPED_AFTER_GPU["19"][2] + 2.018 - 2.000, SHIPPED_AFTER_GPU["19"][3] + 1.615 - 1.597)


# Stage 21 (2026-12-06, the same Intel Xeon): stage 20 continued 110 minutes (2 threads; 3,188 steps, nothing beside
# it) over human-d's 1,600 answers (303,185 answer tokens) beside the rest; beside stage 20 in one run (bf16: 2.026 /
# 1.633 against 2.018 / 1.615). Shipped.
SHIPPED_AFTER_GPU["21"] = (160 + 106 + 105 + 75 + 90 + 90 + 90 + 80 + 110, SHIPPED_AFTER_GPU["20"][1] + 303_185,
                           SHIPPED_AFTER_GPU["20"][2] + 2.026 - 2.018, SHIPPED_AFTER_GPU["20"][3] + 1.633 - 1.615)

# Stage 22 (2026-12-07, an Intel Ice Lake without native bf16): stage 21 continued 50 minutes (2 threads, the draft in
# float32; 898 steps) over human-e's 4,608 answers (934,744 answer tokens) and gpu-b; beside stage 21 in one run (bf16,
# emulated there: 1.936 / 1.660 against 1.927 / 1.641). Not shipped: its trees lost on both sets (docs/history.md
# §27).
AFTER_GPU.append((SHIPPED_AFTER_GPU["21"][0] + 50, SHIPPED_AFTER_GPU["21"][1] + 934_744,
                  SHIPPED_AFTER_GPU["21"][2] + 1.936 - 1.927, SHIPPED_AFTER_GPU["21"][3] + 1.660 - 1.641, "22"))

# Stage 23 (2026-12-07, the same Ice Lake): stage 22 continued 70 minutes (2 threads, float32; 1,457 steps) over
# human-code's 2,240 human code answers (738,782 answer tokens) beside human-e and gpu-b, the head over stage 21's ids;
# beside stage 21 in one run (bf16, emulated there: 1.968 / 1.610 against 1.929 / 1.641). Not shipped: MT-Bench's bf16
# chain lost (docs/history.md §28).
AFTER_GPU.append((SHIPPED_AFTER_GPU["21"][0] + 50 + 70, SHIPPED_AFTER_GPU["21"][1] + 934_744 + 738_782,
                  SHIPPED_AFTER_GPU["21"][2] + 1.968 - 1.929, SHIPPED_AFTER_GPU["21"][3] + 1.610 - 1.641, "23"))

# Stage 24 (2026-12-07, the same Ice Lake): stage 23 continued 60 minutes (2 threads, float32; 1,213 steps) over
# cpu-b's greedy answers (which stage 21 had seen: no new distinct tokens) beside human-e, gpu-b and human-code;
# beside stage 21 in one run (bf16, emulated there: 2.017 / 1.657 against 1.922 / 1.644). Shipped (docs/history.md
# §30).
SHIPPED_AFTER_GPU["24"] = (SHIPPED_AFTER_GPU["21"][0] + 50 + 70 + 60, SHIPPED_AFTER_GPU["21"][1] + 934_744 + 738_782,
                           SHIPPED_AFTER_GPU["21"][2] + 2.017 - 1.922, SHIPPED_AFTER_GPU["21"][3] + 1.657 - 1.644)

# Stage 25 (2026-12-07, the same Ice Lake): stage 24 continued 55 minutes (2 threads, float32; 1,227 steps) over
# cpu-a's last 2,992 greedy answers (seen by stage 17: no new distinct tokens) beside cpu-b, gpu-b, human-e and
# human-code; beside stage 24 in one run (bf16, emulated there: 2.033 / 1.666 against 2.017 / 1.657). Not shipped:
# MT-Bench's trees and q4 chain lost (docs/history.md §31).
AFTER_GPU.append((SHIPPED_AFTER_GPU["24"][0] + 55, SHIPPED_AFTER_GPU["24"][1],
                  SHIPPED_AFTER_GPU["24"][2] + 2.033 - 2.017, SHIPPED_AFTER_GPU["24"][3] + 1.666 - 1.657, "25"))


def lineage_hours() -> list[float]:
    hours, total = [], 0.0
    for minutes, *_ in STAGES.values():
        total += minutes / 60
        hours.append(total)
    return hours


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/smollm2-tau-vs-data.png")
    args = parser.parse_args()
    hours = lineage_hours()
    tokens = [v[1] / 1e6 for v in STAGES.values()]
    extra_hours = [hours[-1] + m / 60 for m, *_ in NOT_SHIPPED]
    extra_tokens = [t / 1e6 for _, t, *_ in NOT_SHIPPED]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120, sharey=True)
    for ax, xs, extra_x, label in ((axes[0], hours, extra_hours, "CPU-hours of training (2 cores)"),
                                   (axes[1], tokens, extra_tokens, "distinct response tokens (millions, log)")):
        for column, name, marker, color in ((2, "HumanEval", "o", "tab:blue"), (3, "MT-Bench first turns", "s",
                                                                                 "tab:orange")):
            ax.plot(xs, [v[column] for v in STAGES.values()], marker=marker, color=color, label=name)
            ax.scatter(extra_x, [e[column] for e in NOT_SHIPPED], marker=marker, facecolors="none", edgecolors=color,
                       label=f"{name}, not shipped")
            gpu_x = [hours[-1] if xs is hours else v[1] / 1e6 for v in GPU_STAGES.values()]
            ax.plot([xs[-1], *gpu_x], [STAGES["9"][column], *(v[column] for v in GPU_STAGES.values())],
                    linestyle="--", color=color)
            ax.scatter(gpu_x, [v[column] for v in GPU_STAGES.values()], marker="*", s=140, color=color,
                       label=f"{name}, GPU stage")
            after_x = [hours[-1] + m / 60 if xs is hours else (GPU_STAGES["10"][1] + t) / 1e6
                       for m, t, *_ in AFTER_GPU]
            ax.scatter(after_x, [e[column] for e in AFTER_GPU], marker=marker, facecolors="none", edgecolors=color)
            for x, point in zip(after_x, AFTER_GPU):
                ax.annotate(point[4], (x, point[column]), textcoords="offset points", xytext=(0, 7),
                            ha="center", fontsize=7)
            later_x = [hours[-1] + m / 60 if xs is hours else (GPU_STAGES["10"][1] + t) / 1e6
                       for m, t, *_ in SHIPPED_AFTER_GPU.values()]
            ax.plot([gpu_x[-1], *later_x], [GPU_STAGES["10"][column], *(v[column] for v in SHIPPED_AFTER_GPU.values())],
                    marker=marker, color=color, markevery=list(range(1, len(later_x) + 1)))
            for stage, x, point in zip(SHIPPED_AFTER_GPU, later_x, SHIPPED_AFTER_GPU.values()):
                ax.annotate(stage, (x, point[column]), textcoords="offset points", xytext=(0, 6), ha="center",
                            fontsize=8)
        for stage, x, (_, _, humaneval, _) in zip(STAGES, xs, STAGES.values()):
            ax.annotate(stage, (x, humaneval), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        for stage, (minutes, tokens_, humaneval, _) in GPU_STAGES.items():
            x = hours[-1] if xs is hours else tokens_ / 1e6
            ax.annotate(f"{stage} (GPU, {minutes:.0f} min)", (x, humaneval), textcoords="offset points",
                        xytext=(-6, 8), ha="right", fontsize=8)
        ax.axhline(2.0, color="tab:blue", linestyle=":", linewidth=1)
        ax.axhline(1.7, color="tab:orange", linestyle=":", linewidth=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_xscale("log")
    axes[0].set_ylabel("online chain tau (K=8, greedy)")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("SmolLM2-135M draft: tau against CPU time and data (numbers: stages; dotted: the 2.0 / 1.7 goals)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out)
    # The late slope: stages 5-9 against their hours and their data doublings.
    (h5, h9), (t5, t9) = (hours[4], hours[8]), (tokens[4], tokens[8])
    import math

    for column, name, goal in ((2, "HumanEval", 2.0), (3, "MT-Bench", 1.7)):
        tau5, tau9 = STAGES["5"][column], STAGES["9"][column]
        per_hour, per_doubling = (tau9 - tau5) / (h9 - h5), (tau9 - tau5) / math.log2(t9 / t5)
        print(f"{name}: +{per_hour:.3f} tau per CPU-hour and +{per_doubling:.3f} per doubling of data over stages "
              f"5-9; {goal} needs {(goal - tau9) / per_hour:.0f} more CPU-hours at that slope, or "
              f"{2 ** ((goal - tau9) / per_doubling):.0f}x the data")
    # The CPU slope after the GPU stage: stage 10 to the last shipped stage, and the last step alone.
    before, last = list(SHIPPED_AFTER_GPU)[-2:]
    minutes, _, *taus = SHIPPED_AFTER_GPU[last]
    for column, name, goal in ((2, "HumanEval", 2.0), (3, "MT-Bench", 1.7)):
        per_hour = (taus[column - 2] - GPU_STAGES["10"][column]) / (minutes / 60)
        step_minutes, _, *step_taus = SHIPPED_AFTER_GPU[before]
        per_hour_last = (taus[column - 2] - step_taus[column - 2]) / ((minutes - step_minutes) / 60)
        left = goal - taus[column - 2]
        outlook = (f"{goal} reached on this curve's scale (the curve's values are stage 21's AMX-Xeon run plus "
                   "each later stage's same-run gain)" if left <= 0 else
                   f"{goal} needs {left / per_hour:.1f} more CPU-hours at the first slope, {left / per_hour_last:.1f} "
                   "at the second")
        print(f"{name}: +{per_hour:.3f} tau per CPU-hour from stage 10 to {last} (+{per_hour_last:.3f} from "
              f"{before} to {last}); {outlook}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
