"""The target's linears at the GGUF file's own precision: Q4_1 blocks run as int4-packed weights on CPU.

Q4_1 (llama.cpp) cuts each row of a weight [N, D] into blocks of 32 inputs. A block is 20 bytes: float16 d and m,
then 16 bytes of 4-bit codes q in 0..15 (byte j holds element j in its low nibble and element j + 16 in its high
one), and means w = d * q + m. torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`, group size 32) means
w = (q - 8) * scale + zero per group, so a block is a group with scale = d and zero = m + 8d.

Why: a one-token step is bound by the bytes of weight it reads. The layers' linears are 212 MB in bf16 and 66 MB
as Q4_1; the int4 kernel reads the latter. Every product of the layers runs the int4 kernel, at every row count:
its rows are computed independently (row r of an M-row product has the bits of that row alone, tested), so a
one-token step of the target alone and a K-row verify block multiply by the same weights in the same way, and
speculation returns the target's own tokens. At many rows (a long prefill) it is about 1.3x slower than a bf16
product, which would need the 212 MB of bf16 weights kept beside the int4 ones; they are freed instead.
Scales and zeros are kept in bf16: the kernel is fast with them, and they round the weights about as much as
storing the weights themselves in bf16 does.

Shapes: M rows, D input features, N output features, G = D / 32 blocks per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from ..errors import ConfigError

BLOCK = 32  # inputs per Q4_1 block, and the kernel's group size
BLOCK_BYTES = 20  # float16 d, float16 m, 16 bytes of codes
# A fused projection of weights.layer_linears -> its parts, stacked along N in this order.
FUSED = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


class UnsupportedQuantization(ValueError):
    """A GGUF tensor the int4 path cannot take as it is (another quantization type); the message names it."""


@dataclass(frozen=True)
class Q4Blocks:
    """One weight's raw Q4_1 blocks, rows in the Hugging Face order: raw [N, G * 20] uint8."""

    raw: torch.Tensor  # [N, G * 20]

    @property
    def shape(self) -> tuple[int, int]:
        return self.raw.shape[0], self.raw.shape[1] // BLOCK_BYTES * BLOCK


def unpack_q4_1(blocks: Q4Blocks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes [N, D] int32 in 0..15, d [N, G] and m [N, G] float32 (exact: float16 widened)."""
    N, D = blocks.shape
    raw = blocks.raw.reshape(N, D // BLOCK, BLOCK_BYTES)  # [N, G, 20]
    d = raw[..., 0:2].contiguous().view(torch.float16).float()[..., 0]  # [N, G]
    m = raw[..., 2:4].contiguous().view(torch.float16).float()[..., 0]  # [N, G]
    qs = raw[..., 4:]  # [N, G, 16]: element j low nibble, element j + 16 high nibble
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # [N, G, 32]
    return codes.reshape(N, D).to(torch.int32), d, m


def dequantize_q4_1(blocks: Q4Blocks) -> torch.Tensor:
    """The block's own weights w = d * q + m [N, D] float32, as llama.cpp defines them."""
    codes, d, m = unpack_q4_1(blocks)
    return d.repeat_interleave(BLOCK, dim=1) * codes.float() + m.repeat_interleave(BLOCK, dim=1)


@dataclass(frozen=True)
class Q4Weight:
    """A weight [N, D] in the CPU int4 kernel's form: packed [N, D / 2] uint8 and scales_zeros [G, N, 2] bf16."""

    packed: torch.Tensor  # [N, D / 2]
    scales_zeros: torch.Tensor  # [G, N, 2]: (scale, zero) per block, w = (q - 8) * scale + zero
    in_features: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales_zeros))


def int4_form(parts: list[Q4Blocks]) -> tuple[torch.Tensor, torch.Tensor]:
    """The parts' weights stacked along N (one part: the weight itself) in the int4 kernel's terms: codes [N, D]
    int32 in 0..15 and scales_zeros [G, N, 2] bf16, (d, m + 8d) per block."""
    unpacked = [unpack_q4_1(p) for p in parts]
    codes, d, m = (torch.cat(column) for column in zip(*unpacked))  # [N, D], [N, G], [N, G]
    scales_zeros = torch.stack([d, m + 8 * d], dim=-1).transpose(0, 1).to(torch.bfloat16).contiguous()  # [G, N, 2]
    return codes, scales_zeros


def pack_int4(codes: torch.Tensor, scales_zeros: torch.Tensor) -> Q4Weight:
    """codes [N, D] and scales_zeros [G, N, 2] (`int4_form`) as the kernel's packed weight."""
    return Q4Weight(torch._convert_weight_to_int4pack_for_cpu(codes, 1), scales_zeros, codes.shape[1])  # [N, D/2]


def dequantize_int4(codes: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """The weights [N, D] float32 the int4 kernel multiplies by: (q - 8) * scale + zero, in float32 as the kernel
    computes them (the same bits as the kernel run on the identity; tests/test_q4.py)."""
    scale, zero = (scales_zeros[..., i].t().float().repeat_interleave(BLOCK, dim=1) for i in (0, 1))  # [N, D]
    return (codes.float() - 8) * scale + zero


def int4_product(x: torch.Tensor, weight: Q4Weight) -> torch.Tensor:
    """x [M, D] -> [M, N] over the int4 weight: the one int4 product (Q4Linear runs it; scripted.py's loop runs its
    TorchScript twin). float32 x with float32 scales keeps the product in float32."""
    scales_zeros = weight.scales_zeros if x.dtype == torch.bfloat16 else weight.scales_zeros.to(x.dtype)
    return torch._weight_int4pack_mm_for_cpu(x, weight.packed, BLOCK, scales_zeros)


class Q4Linear:
    """x [..., D] -> [..., N] over an int4 weight, at any row count; inference only (the kernel has no backward)."""

    def __init__(self, weight: Q4Weight) -> None:
        self.weight = weight
        # `int4_product` unchecked, its operands bound (as `PackedConcat.product`): x [M, D] bf16, 2-D, contiguous,
        # no gradient. A one-token step of a 30-layer target calls it 120 times, where a Python frame is not free.
        self.product = partial(torch._weight_int4pack_mm_for_cpu, mat2=weight.packed, qGroupSize=BLOCK,
                               qScaleAndZeros=weight.scales_zeros)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad:  # the kernel has no backward: a gradient would silently stop here
            raise ConfigError("int4 weights (--weights q4) serve inference only; train over a bf16 or float32 target")
        flat = x.reshape(-1, x.shape[-1]).contiguous()  # [M, D]
        return int4_product(flat, self.weight).view(*x.shape[:-1], -1)


# The int4 kernel's packed layout interleaves output rows in groups of this many: rows a..b of a packed weight are
# a weight of their own only when a and b are multiples of it (tests/test_q4.py).
PACKED_ROW_GROUP = 64


class Q4Module(nn.Module):
    """An `nn.Linear` stand-in for output rows start..stop-1 of an int4 weight, so that the Hugging Face model,
    whose bf16 projections are freed, still runs the same products as the target's fast path. The rows run as a
    view of the weight when they start and stop on its packed row groups, else as the whole product, sliced."""

    def __init__(self, weight: Q4Weight, start: int, stop: int) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.in_features, stop - start
        if start % PACKED_ROW_GROUP == 0 and stop % PACKED_ROW_GROUP == 0:
            self.kernel, self.rows = Q4Linear(rows_of(weight, start, stop)), None
        else:
            self.kernel, self.rows = Q4Linear(weight), slice(start, stop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.kernel(x)
        return out if self.rows is None else out[..., self.rows]


def rows_of(weight: Q4Weight, start: int, stop: int) -> Q4Weight:
    """Output rows start..stop-1 (multiples of PACKED_ROW_GROUP) of an int4 weight: the packed codes as a view, the
    scales copied (small)."""
    if start % PACKED_ROW_GROUP or stop % PACKED_ROW_GROUP:
        raise ValueError(f"rows {start}..{stop} cut the packed row groups of {PACKED_ROW_GROUP}")
    return Q4Weight(weight.packed[start:stop], weight.scales_zeros[:, start:stop].contiguous(), weight.in_features)


def int4_layer(blocks: dict[str, Q4Blocks]) -> dict[str, Q4Weight]:
    """A layer's projections as int4 weights, q/k/v and gate/up stacked into one product each (the names of
    weights.layer_linears: qkv, o, gate_up, down), from the layer's Q4_1 blocks (by part name)."""
    return {name: pack_int4(*int4_form([blocks[part] for part in FUSED.get(name, (name,))]))
            for name in ("qkv", "o", "gate_up", "down")}


def replace_projections(modules: dict, owners: dict, weights: dict[str, Q4Weight]) -> None:
    """Swap each projection module (`modules`, by part name; `owners[part]` = (parent module, attribute)) for a
    Q4Module over its rows of the layer's int4 `weights`; the bf16 weights they held are dropped."""
    for name, weight in weights.items():
        start = 0
        for part in FUSED.get(name, (name,)):
            stop = start + modules[part].out_features
            if modules[part].in_features != weight.in_features:  # another model's file pairs shapes wrongly
                raise ConfigError(f"the GGUF's {part} projection takes {weight.in_features} inputs, the target's "
                                  f"{modules[part].in_features}; pass the GGUF of this target")
            owner, attribute = owners[part]
            setattr(owner, attribute, Q4Module(weight, start, stop))
            start = stop
        if start != weight.packed.shape[0]:
            raise ConfigError(f"the GGUF's {name} weights have {weight.packed.shape[0]} rows, the target's "
                              f"{start}; pass the GGUF of this target")


def release_freed_memory() -> None:
    """Hand the freed bf16 projections' memory back to the system now: without this, glibc keeps most of it in the
    process (about 290 MB more resident for SmolLM2-135M)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, Windows, musl): the memory is reused by the process
        pass
