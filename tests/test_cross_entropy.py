"""The head's hard-label cross-entropy (train/cross_entropy.py): F.cross_entropy's value and gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blockdraft.train.cross_entropy import cross_entropy, cross_entropy_and_argmax


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_value_and_gradient_equal_torchs(dtype):
    torch.manual_seed(0)
    logits = (torch.randn(37, 301, dtype=dtype) * 4).requires_grad_()
    labels = torch.randint(0, 301, (37,))
    weights = torch.rand(37, dtype=dtype)  # the slot weights the objective multiplies in
    mine = cross_entropy(logits, labels)
    (grad_mine,) = torch.autograd.grad((mine * weights).sum(), logits)
    ref = F.cross_entropy(logits, labels, reduction="none")
    (grad_ref,) = torch.autograd.grad((ref * weights).sum(), logits)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(mine, ref, atol=tol, rtol=tol)
    torch.testing.assert_close(grad_mine, grad_ref, atol=tol, rtol=tol)


def test_gradcheck_in_float64():
    torch.manual_seed(1)
    logits = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 6, 3, 3, 1])
    assert torch.autograd.gradcheck(lambda z: cross_entropy(z, labels), (logits,))


def test_shapes_that_are_not_rows_of_classes_are_refused():
    with pytest.raises(ValueError, match=r"logits \[r, V\] and labels \[r\]"):
        cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long))


def test_argmax_comes_with_the_loss():
    torch.manual_seed(2)
    logits = torch.randn(64, 1000) * 3
    logits[5, [10, 20]] = 50.0  # a tie for the top: the first index, as argmax gives
    labels = torch.randint(0, 1000, (64,))
    ce, top = cross_entropy_and_argmax(logits.requires_grad_(), labels)
    assert torch.equal(top, logits.detach().argmax(-1))
    assert not top.requires_grad
    torch.testing.assert_close(ce, F.cross_entropy(logits, labels, reduction="none"))


def test_a_retained_graph_gives_the_same_gradient_twice():
    torch.manual_seed(3)
    logits = torch.randn(3, 5, requires_grad=True)
    loss = cross_entropy(logits, torch.tensor([0, 1, 2])).sum()
    (first,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (second,) = torch.autograd.grad(loss, logits)
    assert torch.equal(first, second)


def test_bf16_logits_are_computed_in_float32_with_a_bf16_gradient():
    torch.manual_seed(4)
    logits = (torch.randn(41, 500) * 4).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 500, (41,))
    weights = torch.rand(41)
    mine = cross_entropy(logits, labels)
    (grad_mine,) = torch.autograd.grad((mine * weights).sum(), logits)
    wide = logits.detach().float().requires_grad_()
    ref = F.cross_entropy(wide, labels, reduction="none")  # the old path: upcast, then torch's loss
    (grad_ref,) = torch.autograd.grad((ref * weights).sum(), wide)
    assert mine.dtype == torch.float32 and grad_mine.dtype == torch.bfloat16
    torch.testing.assert_close(mine, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad_mine, grad_ref.to(torch.bfloat16), atol=0, rtol=0)  # each entry rounded once
