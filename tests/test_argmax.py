"""first_argmax: torch.argmax's answer (first among equals, NaN first) on every shape, dtype and layout."""

from __future__ import annotations

import pytest
import torch

from blockdraft.sampling.argmax import first_argmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7,), (1, 1, 50), (3, 5, 11), (2, 1)])
def test_first_argmax_is_torch_argmax_with_ties_and_nans(dtype, shape):
    generator = torch.Generator().manual_seed(0)
    for trial in range(50):
        x = torch.randint(0, 4, shape, generator=generator).to(dtype)  # many ties
        if trial % 5 == 0:
            x.view(-1)[int(torch.randint(0, x.numel(), (1,), generator=generator))] = float("nan")
        if trial % 7 == 0 and x.dim() > 1:
            x = x.transpose(0, -1).contiguous().transpose(0, -1)  # strided rows
        expected = x.argmax(dim=-1)
        got = first_argmax(x)
        assert got.dtype == torch.int64 and got.shape == expected.shape
        assert torch.equal(got, expected), (x, got, expected)


def test_first_argmax_takes_tensors_that_need_a_gradient():
    x = torch.tensor([[0.0, 2.0, 2.0, 1.0]], requires_grad=True)
    assert first_argmax(x).tolist() == [1]


def test_a_last_index_argmax_fails_the_same_test():
    """The comparison can fail: an argmax that returns the last of equal maxima is told apart."""
    x = torch.tensor([[1.0, 3.0, 3.0]])
    last = x.shape[-1] - 1 - x.flip(-1).argmax(dim=-1)
    assert not torch.equal(last, x.argmax(dim=-1)) and torch.equal(first_argmax(x), x.argmax(dim=-1))
