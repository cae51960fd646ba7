"""Linears over weights packed once for the CPU's matrix kernels (bf16 on CPU only).

A bf16 `F.linear` on CPU hands a plain row-major weight to oneDNN, which re-lays it out on every call. For the
few-row products of decoding (one token, or a block of K) that relayout costs about as much as the product, so
a target step ran near half the speed the memory allows. Packing each weight once, in oneDNN's own layout,
removes it: the same products with the same bf16 results (bit for bit), 1.5-1.8x faster here at 1 to 256 rows.

Only bf16 weights on CPU are packed. In float32 the packed kernel is slower for one or two rows and rounds
differently from `F.linear`; on GPU the weights are used as they are.

The packed copy lives beside the model's own weight (the Hugging Face module stays usable and unchanged), so it
costs the linears' memory a second time; `Target` packs only when that copy fits comfortably in RAM.

Shapes: M rows, D input features, N output features.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from .layers import linear_rows

# The packing hint: the row count the layout is tuned for. Decode steps run 1 to K rows; a layout packed for
# 8 rows measured as fast as one packed for 1 at one row, and faster from 2 rows up.
PACK_ROWS = 8


def packing_supported(weight: torch.Tensor) -> bool:
    """Whether `weight` [N, D] can be packed: a bf16 CPU tensor, with oneDNN's packed linear in this torch."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def fits_in_memory(nbytes: int, share: float = 0.25) -> bool:
    """Whether a second copy of `nbytes` stays under `share` of this machine's physical memory."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): do not risk the memory
        return False
    return nbytes <= share * total


class PackedLinear:
    """x [..., D] -> [..., N], as `F.linear(x, weight, bias)`, over a copy of weight [N, D] packed once.

    Inputs that need a gradient, or that do not match the weight's dtype and device, take `F.linear` on the
    original weight: the packed kernel has no backward, and only serves the inference forward. A weight changed
    in place after packing (a loaded state dict) is packed again on the next call, so the copy is never stale.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias
        self._pack()

    def _pack(self) -> None:
        self.version = _version(self.weight)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_ROWS)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad or x.dtype != self.weight.dtype or x.device != self.weight.device:
            return F.linear(x, self.weight, self.bias)
        if _version(self.weight) != self.version:
            self._pack()
        flat = x.reshape(-1, x.shape[-1])  # [M, D], contiguous as oneDNN needs
        out = torch.ops.mkldnn._linear_pointwise(flat.contiguous(), self.packed, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], -1)


def _version(weight: torch.Tensor) -> int | None:
    """The weight's in-place modification counter; None for an inference tensor, which keeps none."""
    return None if weight.is_inference() else weight._version


def head_linear(weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = True):
    """x [..., D] -> [..., N] over weight [N, D]: packed when `pack` and supported, else `linear_rows`."""
    if pack and packing_supported(weight):
        return PackedLinear(weight, bias)
    return lambda x: linear_rows(x, weight, bias)


def pack_linear(module: torch.nn.Linear) -> PackedLinear | torch.nn.Linear:
    """A PackedLinear over `module`'s weight and bias when packing is supported, else `module` itself."""
    if not packing_supported(module.weight):
        return module
    return PackedLinear(module.weight, module.bias)
