"""The head's hard-label cross-entropy (train/cross_entropy.py): F.cross_entropy's value and gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blockdraft.train.cross_entropy import cross_entropy


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
