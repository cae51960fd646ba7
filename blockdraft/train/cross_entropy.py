"""Cross-entropy against hard labels with one pass over the logits each way: the head's loss on a CPU.

`F.cross_entropy(logits, labels)` keeps log_softmax(logits) [r, V] and, backward, fills a dense one-hot gradient
[r, V] with zeros, scatters into it and runs log_softmax's backward over it: three passes over r x V floats,
about a quarter of a CPU training step over a 23k-id proposal vocabulary. The gradient has a closed form,

    d CE_i / d z_iv = softmax(z_i)_v - [v = y_i]   (times the incoming gradient g_i),

so this keeps z and logsumexp(z) [r] and writes exp(z - lse) - onehot in place, once. Same value and gradient.

Shapes: r rows, V classes.
"""

from __future__ import annotations

import torch


class _HardLabelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        lse = torch.logsumexp(logits, dim=-1)  # [r]
        ctx.save_for_backward(logits, lse, labels)
        return lse - logits.gather(-1, labels[:, None])[:, 0]  # [r]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, lse, labels = ctx.saved_tensors
        out = torch.sub(logits, lse[:, None]).exp_()  # softmax [r, V], one new tensor
        rows = torch.arange(out.shape[0], device=out.device)
        out[rows, labels] -= 1.0
        return out.mul_(grad[:, None]), None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-row CE [r] of logits [r, V] (float) against class ids labels [r]; as F.cross_entropy(reduction="none")."""
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy takes logits [r, V] and labels [r], got {tuple(logits.shape)} and "
                         f"{tuple(labels.shape)}")
    return _HardLabelCrossEntropy.apply(logits, labels)
