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
from torch import nn

from . import kernels
from .layers import linear_rows

# The packing hint: the row count the layout is tuned for. Decode steps run 1 to K rows; a layout packed for
# 8 rows measured as fast as one packed for 1 at one row, and faster from 2 rows up.
PACK_ROWS = 8


def packing_supported(weight: torch.Tensor) -> bool:
    """Whether `weight` [N, D] can be packed: a bf16 CPU tensor, on a CPU where oneDNN's packed bf16 linear runs
    (kernels.py; an AVX2 CPU lacks it)."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and kernels.cpu_paths().packed_bf16


def fits_in_memory(nbytes: int, share: float = 0.25) -> bool:
    """Whether a second copy of `nbytes` stays under `share` of this machine's physical memory."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): do not risk the memory
        return False
    return nbytes <= share * total


class PackedConcat:
    """x [..., D] -> [..., N1 + N2 + ...], as `torch.cat([F.linear(x, w, b) for w, b in ...], -1)`, in one product
    over the weights [Ni, D] stacked and packed once (one weight: a plain linear, `PackedLinear`; several: a
    layer's q/k/v or gate/up projections).

    One product instead of several saves the per-call cost of the small decode GEMMs (q/k/v of a SmolLM2 layer:
    61 us apart, 24 us together at one row here). For the few rows of a decode step (1 to 100 measured) the bits
    are those of the separate products; a long prefill's product may round differently, as any change of GEMM
    kernel can. The target alone and speculative decoding run the same products, so their outputs still agree.

    Inputs that need a gradient, or that do not match the weights' dtype and device, take `F.linear` on the
    original weights: the packed kernel has no backward, and only serves the inference forward. A weight or bias
    changed after packing (in place, as a loaded state dict does, or replaced, as `.to()` does) is packed again on
    the next call, or left to `F.linear` when it is no longer a bf16 CPU tensor; the copy is never stale.
    """

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor] | None = None) -> None:
        self.weights, self.biases = list(weights), None if biases is None else list(biases)
        self._pack()

    def _stamp(self) -> tuple:
        return tuple((_version(w), w.data_ptr(), w.dtype) for w in self.weights + (self.biases or []))

    def _pack(self) -> None:
        self.stamp = self._stamp()
        self.bias = None if self.biases is None else _joined([b.detach() for b in self.biases])  # [N1 + N2 + ...]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(_joined([w.detach() for w in self.weights]), PACK_ROWS)

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, _joined(self.weights), None if self.biases is None else _joined(self.biases))

    def ready(self) -> bool:
        """Whether the packed copy serves the weights as they are now: packed again first when they changed since
        (in place, or replaced); False when they can no longer be packed (`F.linear` must take them)."""
        if self._stamp() != self.stamp:
            if not all(packing_supported(w) for w in self.weights):
                return False
            self._pack()
        return True

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """The packed product, unchecked: x [..., D] must match the weights' dtype and device and need no gradient,
        and `ready()` must have held since the weights last changed (a forward over many linears checks them all
        once, target.py, instead of once per call). A single row runs as a pair where oneDNN would multiply it
        otherwise than a row among several (`single_row_differs`)."""
        flat = x.reshape(-1, x.shape[-1]).contiguous()  # [M, D], contiguous as oneDNN needs
        if flat.shape[0] == 1 and single_row_differs(self.packed, self.bias):
            out = _packed_product(flat.expand(2, -1).contiguous(), self.packed, self.bias)[:1]
        else:
            out = _packed_product(flat, self.packed, self.bias)
        return out.view(*x.shape[:-1], -1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        first = self.weights[0]
        if x.requires_grad or x.dtype != first.dtype or x.device != first.device or not self.ready():
            return self._reference(x)
        return self.product(x)


def single_row_differs(packed: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether oneDNN multiplies a single row by this packed weight otherwise than the same row among several.

    For one row oneDNN may take another kernel, which sums the inputs in another order: here a 1536-input
    product (SmolLM2's MLP down projection) rounded 1 row in 10 apart in bf16, while every row count from 2 on
    agreed with every other. A one-token step of the target alone would then round apart from the same token in
    a verify block. Asked once per weight shape, bias and thread count, on `CHECK_ROWS` rows of fixed random
    inputs through this weight; where it differs, single rows run as a pair (about 10 us more for that product).
    """
    key = (tuple(packed.shape), bias is not None, torch.get_num_threads())  # packed keeps the shape [N, D]
    if key not in _SINGLE_ROW_DIFFERS:
        x = torch.randn(CHECK_ROWS, packed.shape[1], generator=torch.Generator().manual_seed(0)).mul_(0.05)
        x = x.to(packed.dtype)  # [CHECK_ROWS, D]
        together = _packed_product(x, packed, bias)
        _SINGLE_ROW_DIFFERS[key] = any(not torch.equal(_packed_product(x[r : r + 1], packed, bias)[0], together[r])
                                       for r in range(CHECK_ROWS))
    return _SINGLE_ROW_DIFFERS[key]


def _packed_product(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """rows [M, D] contiguous -> [M, N]: oneDNN's product over a packed weight."""
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


CHECK_ROWS = 32  # a kernel that sums in another order rounds about 1 row in 10 apart: 32 rows miss it 1 time in 30
_SINGLE_ROW_DIFFERS: dict[tuple, bool] = {}


class PackedLinear(PackedConcat):
    """x [..., D] -> [..., N], as `F.linear(x, weight, bias)`, over a copy of weight [N, D] packed once."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        super().__init__([weight], None if bias is None else [bias])


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts stacked along dim 0; a single part as it is (no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def pack_concat(modules: list[nn.Linear]) -> PackedConcat | None:
    """A PackedConcat over the modules' weights (and biases), or None when they cannot share one: a weight that
    cannot be packed, different dtypes or input sizes, or biases on some and not the others."""
    weights = [m.weight for m in modules]
    biases = [m.bias for m in modules]
    if not all(packing_supported(w) for w in weights) or len({(w.dtype, w.shape[1]) for w in weights}) != 1:
        return None
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    return PackedConcat(weights, None if biases[0] is None else biases)


class PackedLinearModule(nn.Linear):
    """An `nn.Linear` that runs over a packed copy of its own weight (same parameters, same state-dict keys)."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.kernel = PackedLinear(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x)


def pack_module(module: nn.Module) -> int:
    """Swap every bf16 CPU `nn.Linear` inside `module` for a PackedLinearModule over the same parameters, in
    place; returns how many were swapped. For a model used for inference (a loaded draft); training is unaffected
    (inputs that need a gradient take `F.linear`), and the state dict keeps its keys."""
    swapped = 0
    for name, child in list(module.named_children()):
        if type(child) is nn.Linear and packing_supported(child.weight):
            setattr(module, name, PackedLinearModule(child))
            swapped += 1
        else:
            swapped += pack_module(child)
    return swapped


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
