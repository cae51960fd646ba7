"""benchmarks/train_throughput.py with the head's loss of before 2026-11-28: one chunk of up to 2048 supervised rows,
float32 logits, torch's cross-entropy and a separate argmax (the loss path `train` took when the feature store
issue was filed). Run from the repository root: python benchmarks/results/2026-11-28-train-ce/before.py"""
import sys

import torch.nn.functional as F

import blockdraft.train.objective as o

o.CPU_CHUNK_BYTES = 2048 * 4 * 23234 * 4  # the old 2048-row chunks


def old_loss(logits, labels):
    logits = logits.float()
    return F.cross_entropy(logits, labels, reduction="none"), logits.argmax(-1)


o.cross_entropy_and_argmax = old_loss
sys.path.insert(0, "benchmarks")
import train_throughput  # noqa: E402

sys.argv = ["train_throughput.py", "--data", "datasets/smollm2-135m-instruct/gpu-a", "--recipe", "k4"]
sys.exit(train_throughput.main())
