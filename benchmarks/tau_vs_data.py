"""The shipped SmolLM2 draft's online chain tau against the response tokens its lineage has trained on.

    python benchmarks/tau_vs_data.py [--out benchmarks/smollm2-tau-vs-data.png]

Each point is one training stage of the shipped draft (its card: blockdraft/drafts/smollm2-135m-instruct/README.md):
x = the distinct target-regenerated response tokens of every data folder the stage and the stages before it trained
on, y = the online greedy chain tau (K=8, 8 prompts, 128 new tokens) on HumanEval and MT-Bench first turns. Every
stage also trained longer than the one before, so data and compute grow together here; stages 3 and 4 were
measured in float32 on another CPU, the rest in bf16.
"""

from __future__ import annotations

import argparse

# stage: (cumulative response tokens, HumanEval tau, MT-Bench tau), from the draft card's data and tau rows.
STAGES = {
    1: (100_727, 1.134, 1.189),
    2: (407_661, 1.186, 1.250),
    3: (661_027, 1.220, 1.250),
    4: (1_031_038, 1.254, 1.271),
    5: (1_272_140, 1.373, 1.308),
    6: (1_729_734, 1.380, 1.329),
    7: (1_957_204, 1.444, 1.334),
    8: (2_359_923, 1.497, 1.337),
    9: (2_486_649, 1.529, 1.348),
}


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/smollm2-tau-vs-data.png")
    args = parser.parse_args()
    tokens = [v[0] / 1e6 for v in STAGES.values()]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for column, label, marker in ((1, "HumanEval", "o"), (2, "MT-Bench first turns", "s")):
        ax.plot(tokens, [v[column] for v in STAGES.values()], marker=marker, label=label)
    for stage, (count, humaneval, _) in STAGES.items():
        ax.annotate(str(stage), (count / 1e6, humaneval), textcoords="offset points", xytext=(0, 6), ha="center",
                    fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("distinct response tokens trained on (millions, log scale)")
    ax.set_ylabel("online chain tau (K=8, greedy)")
    ax.set_title("SmolLM2-135M draft: tau against data (numbers: training stages; 2 CPU cores)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
