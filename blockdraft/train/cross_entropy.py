"""Cross-entropy against hard labels with the fewest passes over the logits: the head's loss on a CPU.

`F.cross_entropy(logits, labels)` keeps log_softmax(logits) [r, V] and, backward, fills a dense one-hot gradient
[r, V] with zeros, scatters into it and runs log_softmax's backward over it: three passes over r x V floats,
about a quarter of a CPU training step over a 23k-id proposal vocabulary. The gradient has a closed form,

    d CE_i / d z_iv = softmax(z_i)_v - [v = y_i]   (times the incoming gradient g_i),

and the forward pass computes most of it already: with m_i = max_v z_iv and e = exp(z - m), s_i = sum_v e_iv,

    CE_i = m_i + log s_i - z_iy,        softmax(z_i) = e_i / s_i.

So the forward keeps e (in the place of the logits) and the backward scales it, writing the logits' dtype, and
sets the label's entries: one pass backward instead of recomputing exp(z - lse) and casting the result. Logits of
a 16-bit head are upcast once, into the tensor that becomes e, and every later pass runs in float32: on a CPU a
bf16 row maximum or a bf16 - float32 subtraction takes several times as long as the same pass in float32
(2026-11-28, Intel Xeon, 196 x 32k bf16 logits, 1 thread beside another job: the forward's median 15.8 ms against
19.6 over 15 alternations; the training step as a whole did not move measurably). e and the loss are float32. The
row maximum's index is the draft's argmax, which the training metrics want: it comes out of the same
pass (`cross_entropy_and_argmax`). Same value and gradient as F.cross_entropy up to float rounding
(tests/test_cross_entropy.py).

Shapes: r rows, V classes.
"""

from __future__ import annotations

import torch


class _HardLabelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor):
        e = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)  # [r, V]: the one new tensor
        top, argmax = e.max(dim=-1)  # [r] each
        picked = e.gather(-1, labels[:, None])[:, 0]  # [r]
        total = e.sub_(top[:, None]).exp_().sum(dim=-1)  # [r]; e is now exp(z - max)
        ce = top + total.log() - picked  # [r]
        ctx.save_for_backward(e, total, labels)
        ctx.mark_non_differentiable(argmax)
        ctx.dtype = logits.dtype
        return ce, argmax

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _argmax_grad):
        e, total, labels = ctx.saved_tensors
        scale = (grad / total)[:, None]  # [r, 1]
        out = torch.mul(e, scale, out=torch.empty(e.shape, dtype=ctx.dtype, device=e.device))  # g * softmax
        rows = torch.arange(e.shape[0], device=e.device)
        # The label's entry g * (e_y - s) / s, from float32 and rounded once; e stays as saved (a retained graph
        # may run this again).
        out[rows, labels] = ((e[rows, labels] - total) * scale[:, 0]).to(ctx.dtype)
        return out, None


def cross_entropy_and_argmax(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row CE [r] float32 of logits [r, V] (any float dtype: computed in float32, the gradient in the logits'
    dtype) against class ids labels [r], as F.cross_entropy(logits.float(), labels, reduction="none"), and each
    row's argmax [r] (no gradient)."""
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy takes logits [r, V] and labels [r], got {tuple(logits.shape)} and "
                         f"{tuple(labels.shape)}")
    return _HardLabelCrossEntropy.apply(logits, labels)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-row CE [r] of logits [r, V] (float) against class ids labels [r]; as F.cross_entropy(reduction="none")."""
    return cross_entropy_and_argmax(logits, labels)[0]
