"""An int4 target's prompts prefilled over packed bf16 copies of its weights, where bf16 products are native.

The int4 kernel (q4.py) suits the few rows of a decode step. A prompt is hundreds of rows, and there it is slow:
on an Intel Xeon with AMX (2 threads) a HumanEval prompt of about 150 tokens took 240 ms to prefill at q4, and
65-80 ms over packed bf16 weights. Under load a server prefills every joining request while the others wait, so at
16 concurrent requests the prefills were about a third of its time.

So where oneDNN's packed bf16 product runs (kernels.py: native bf16), an int4 target also keeps each layer's
products as packed bf16 weights, and `Target.forward(..., prompt=True)` (every prefill of a decode) runs over
them; decode and verify steps stay int4. The bf16 weights are the int4 kernel's own: the identity multiplied
through it gives the weights it multiplies by, rounded to bf16. The copy costs their bf16 bytes (202 MiB for
SmolLM2's layers, beside 117 MiB of int4 layers and head).

A rule of the CPU's features, chosen at load: every prompt of a target is prefilled the same way, in a batch or
alone (rows of one padded width, decode/step.py), so the same request gives the same text. A prompt's cache then
holds bf16 products of the int4 weights rather than the int4 kernel's: the text may differ from a machine without
the copy where a token is a near-tie, as it does between CPU classes anyway (docs/design.md §14).

Shapes: M rows, D in, N out.
"""

from __future__ import annotations

import torch

from . import kernels
from .packed import PACK_ROWS, _packed_product
from .q4 import Q4Linear, int4_product

PRODUCTS = ("qkv", "o", "gate_up", "down")


class PackedPrompt:
    """x [M, D] bf16 -> [M, N]: oneDNN's product over a packed bf16 weight, which only this holds (no float copy)."""

    def __init__(self, weight: torch.Tensor) -> None:  # [N, D] bf16
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()  # [M, D]
        return _packed_product(flat, self.packed, None).view(*x.shape[:-1], -1)


def bf16_weight(linear: Q4Linear) -> torch.Tensor:
    """[N, D] bf16: the int4 kernel's weights, read by multiplying the identity through it."""
    eye = torch.eye(linear.weight.in_features, dtype=torch.bfloat16)  # [D, D]
    return int4_product(eye, linear.weight).t().contiguous()  # [D, N] -> [N, D]


def prompt_products(linears: list[dict], device: torch.device) -> list[dict] | None:
    """Per layer, {"qkv", "o", "gate_up", "down": PackedPrompt} over bf16 copies of the int4 products; None where
    the copy does not apply: not a CPU whose packed bf16 product runs, or products other than stacked int4 ones."""
    if device.type != "cpu" or not kernels.cpu_paths().packed_bf16:
        return None
    if not all(isinstance(linear.get(name), Q4Linear) for linear in linears for name in PRODUCTS):
        return None
    return [{name: PackedPrompt(bf16_weight(linear[name])) for name in PRODUCTS} for linear in linears]
