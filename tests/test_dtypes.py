"""Choosing the compute dtype: named dtypes, and `auto` from what the device runs natively."""

from __future__ import annotations

import pytest
import torch

from blockdraft.errors import ConfigError
from blockdraft.io.targets import parse_dtype
from blockdraft.model import kernels


def test_named_dtypes():
    assert parse_dtype("float32") is torch.float32
    assert parse_dtype("bf16") is torch.bfloat16
    assert parse_dtype(torch.float16) is torch.float16


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_on_cpu_follows_native_bf16(monkeypatch, native, expected):
    paths = kernels.CpuPaths("test", True, native_bf16=native, packed_bf16=native, int4=True)
    monkeypatch.setattr(kernels, "cpu_paths", lambda: paths)
    assert parse_dtype("auto", "cpu") is expected


def test_auto_on_an_accelerator_is_bf16(monkeypatch):
    paths = kernels.CpuPaths("test", True, native_bf16=False, packed_bf16=False, int4=True)
    monkeypatch.setattr(kernels, "cpu_paths", lambda: paths)
    assert parse_dtype("auto", "cuda:0") is torch.bfloat16


def test_unknown_dtype_lists_the_choices():
    with pytest.raises(ConfigError, match="auto or one of"):
        parse_dtype("float8")
