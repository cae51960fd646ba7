"""A draft's products as int4 weights beside an int4 target (`--weights q4`): quantized once at load, run by the
target's own int4 kernel (q4.py).

Why: a decode step is bound by the bytes of weight it reads, and a draft layer of SmolLM2's widths holds as many
weights as a target layer. In bf16 two draft layers and their head read about 23 MB a drafted step, where the
q4 target's 30 layers read about 66: the draft cost a q4 step half again (a drafted chain step of 2 positions
1.80 plain steps on an Ice Lake, 2 threads). As int4 they read about a quarter of that (1.56 plain steps there),
and the shipped draft's online tau moved within the spread of 8 prompts (HumanEval 2.045 against 2.010 in bf16,
MT-Bench 1.613 against 1.626; greedy, K = 8, 128 tokens). The target still verifies every token, so the output
is the target's own whatever the draft's weights: only proposals change.

Quantization: each row's groups of 32 inputs (the kernel's group size) as 4-bit codes q in 0..15 with a step d
and an offset, w = (q - 8) * d + zero (q4.py's form), d = (max - min) / 15 of the group, both in bf16 as the
kernel reads them; the codes round against those bf16 values. Products whose inputs are not a multiple of 32
stay as they are.

Shapes: N output features, D input features, G = D / 32 groups.
"""

from __future__ import annotations

import torch
from torch import nn

from .q4 import BLOCK, PACKED_ROW_GROUP, Q4Linear, Q4Module, Q4Weight, pack_int4


def quantize_int4(weight: torch.Tensor) -> Q4Weight:
    """weight [N, D] (D a multiple of 32) as the int4 kernel's weight: per group of 32 inputs of a row, 16 levels
    from the group's least to its greatest weight."""
    N, D = weight.shape
    if D % BLOCK:
        raise ValueError(f"int4 groups take {BLOCK} inputs at a time; this weight has {D}")
    groups = weight.detach().float().reshape(N, D // BLOCK, BLOCK)  # [N, G, 32]
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # [N, G]
    # A constant group has no spread: any positive step codes it exactly (every code lands on `low`).
    step = ((high - low) / 15).clamp(min=torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16).float()
    zero = (low + 8 * step).to(torch.bfloat16).float()  # the kernel's zero: the weight of code 8
    codes = ((groups - (zero - 8 * step)[..., None]) / step[..., None]).round().clamp(0, 15)  # [N, G, 32]
    scales_zeros = torch.stack([step, zero], dim=-1).transpose(0, 1).to(torch.bfloat16).contiguous()  # [G, N, 2]
    return pack_int4(codes.reshape(N, D).to(torch.int32), scales_zeros)


def quantize_linears(module: nn.Module) -> nn.Module:
    """Replace every bias-free `nn.Linear` inside `module` whose inputs are a multiple of 32 by a Q4Module over its
    int4 weight (in place; returns `module`). Inference only: the int4 kernel has no backward."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and child.bias is None and child.in_features % BLOCK == 0:
            setattr(module, name, Q4Module(quantize_int4(child.weight), 0, child.out_features))
        else:
            quantize_linears(child)
    return module


def is_int4(module: nn.Module) -> bool:
    """Whether `module` holds int4 products (`quantize_linears`)."""
    return any(isinstance(m, Q4Module) for m in module.modules())


def concat_int4(modules: list) -> Q4Linear | None:
    """One product for int4 modules side by side (x -> their outputs concatenated), the bits of each one's own,
    or None where they cannot be stacked: the packed layout interleaves output rows in groups of
    PACKED_ROW_GROUP, so only whole weights of such groups stack."""
    if not all(isinstance(m, Q4Module) and m.rows is None for m in modules):
        return None
    weights = [m.kernel.weight for m in modules]
    if any(w.packed.shape[0] % PACKED_ROW_GROUP for w in weights):
        return None
    return Q4Linear(Q4Weight(torch.cat([w.packed for w in weights]),
                             torch.cat([w.scales_zeros for w in weights], dim=1), weights[0].in_features))


class Int4Head:
    """Head rows [N, D] as an int4 product: x [..., D] -> [..., N] (x cast to bf16, the kernel's input)."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.linear = Q4Linear(quantize_int4(rows))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.to(torch.bfloat16))
