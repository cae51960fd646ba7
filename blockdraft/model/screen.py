"""The greedy screen: the target's argmax over its vocabulary without computing every logit exactly.

A greedy step needs one thing from the LM head: which token scores highest (the first among equals). Where the
head's product gives every logit the bits of a dot product of its own (ATen's bf16 kernel, which a CPU without
native bf16 runs: kernels.aten_bf16_products), the logits of a few of its rows, computed alone, are the bits the
whole head gives them. So:

1. An int8 copy of the head (one scale a row) scores every token cheaply: a_j, from torch's int8 kernel, whose
   cost hardly grows with the number of rows (SmolLM2's head on an Ice Lake, 2 threads: 2.7 / 2.9 / 5.5 ms at
   1 / 4 / 8 rows, against 3.5 / 9.2 / 16.4 for the bf16 head).
2. A bound B_j on |a_j - e_j|, e_j the exact logit: the int8 rounding of row j, |x . (w_j - w8_j)| <=
   ||x||_2 ||w_j - w8_j||_2 (Cauchy-Schwarz, the error norm kept per row), plus both products' float rounding.
3. Every token that could be the argmax: a_j + B_j >= max_i (a_i - B_i). The exact argmax is among them (its
   e_j is at least the threshold, and a_j + B_j >= e_j), and so is every token equal to it.
4. Those tokens' logits exactly, through the head itself; every other logit is -inf.

The argmax (first among equals) of the result is the argmax of the exact logits, bit for bit; its other values
are not logits. Only greedy picks read it (`Target.forward(..., picks_only=True)`); sampling takes the whole head.
A row whose screen keeps more than MAX_KEPT tokens, or holds a NaN or inf, takes the whole head.

Shapes: M rows, D hidden, V vocabulary, C kept tokens.
"""

from __future__ import annotations

import torch

from . import kernels

# A row keeping more tokens than this takes the whole head (about what a gathered product of that many rows costs
# against the whole one, for SmolLM2's head).
MAX_KEPT = 512
# Slack for the float rounding of both products: each bf16 output rounds within 2^-9 of its value (the int8
# product's twice: its sum, then that times the scale), RELATIVE covers both with room; a float32 sum of D
# products within about D * 2^-24 of their magnitudes' sum, at most ||x|| ||w||: SUMS covers D up to 16,384.
RELATIVE = 2.0**-7
SUMS = 2.0**-10
ABSOLUTE = 1e-4


class GreedyScreen:
    """Logits [..., V] whose first argmax is the head's, from final-normed rows [..., D] (see the module)."""

    def __init__(self, weight: torch.Tensor, head) -> None:
        """`weight` [V, D]: the head's weight as `head` (rows [..., D] -> [..., V]) multiplies it."""
        w = weight.detach().to(torch.float32, copy=True)  # [V, D]
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)  # [V]
        scale = _bf16_at_least(scale)  # what the kernel multiplies by, no smaller than asked: codes stay in range
        codes = (w / scale[:, None]).round_().clamp_(-127, 127)  # [V, D]
        self.codes = codes.to(torch.int8)  # [V, D]
        self.scales = scale.to(torch.bfloat16)  # [V]
        w8 = codes.mul_(scale[:, None])  # [V, D]: exact in float32 (7-bit codes times 8-bit scales)
        magnitude = w8.norm(dim=1).mul_(1 + 1e-4)  # [V]: ||w8_j||_2, rounded up
        error = w.sub_(w8).norm(dim=1).mul_(1 + 1e-4)  # [V]: ||w_j - w8_j||_2, rounded up
        self.per_norm = error + SUMS * magnitude  # [V]: bound_j = ||x|| per_norm_j + RELATIVE |a_j| + ABSOLUTE
        self.widest = float(self.per_norm.max())
        self.weight, self.head = weight.detach(), head

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        flat = rows.reshape(-1, rows.shape[-1]).contiguous()  # [M, D]
        approx = torch._weight_int8pack_mm(flat, self.codes, self.scales).float()  # [M, V]
        norm = flat.float().norm(dim=1)  # [M]
        top = approx.amax(dim=1)  # [M]
        # Every bound of a row is at most its slack, so every kept token (and the floor's) lies within two of them
        # of the row's top: `near`, a few dozen entries, where the bounds are then computed one by one.
        slack = norm * self.widest + RELATIVE * approx.abs().amax(dim=1) + ABSOLUTE  # [M]
        whole = ~(torch.isfinite(slack) & torch.isfinite(top))  # [M]: NaN or inf: the whole head
        row, ids = _at_least(approx, top - 2 * slack)  # [n] each
        value = approx[row, ids]  # [n]
        bound = norm[row] * self.per_norm[ids] + RELATIVE * value.abs() + ABSOLUTE  # [n]
        floor = torch.full_like(top, float("-inf")).scatter_reduce(0, row, value - bound, "amax")  # [M]
        kept = value + bound >= floor[row]  # [n]
        row, ids = row[kept], ids[kept]  # every token that may be its row's argmax
        whole |= torch.bincount(row, minlength=len(top)) > MAX_KEPT
        out = torch.full_like(approx, float("-inf"))  # [M, V]
        screened = ~whole[row]
        row, ids = row[screened], ids[screened]
        if len(ids):
            union, slot = ids.unique(return_inverse=True)  # [U] ascending, [n']
            out[row, ids] = self.head_rows(flat, union)[row, slot]
        if bool(whole.any()):
            out[whole] = self.head(flat[whole]).float()
        return out.view(*rows.shape[:-1], -1)

    def head_rows(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The head's logits of tokens ids [C] for rows [M, D] -> [M, C] float32: the bits the whole head gives
        them where `subset_keeps_bits` holds."""
        return torch.nn.functional.linear(rows, self.weight[ids]).float()


# The width of the blocks `_at_least` first finds the row's high entries among.
BLOCK = 128


def _at_least(x: torch.Tensor, low: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of x [M, V] at or above their row's low [M], as (rows, columns) [n] each in row-major order:
    the blocks of BLOCK columns whose largest entry reaches it first (a compare over all of x costs about ten times
    as much as its blocks' maxima), then the entries inside those."""
    M, V = x.shape
    if V % BLOCK:
        x = torch.nn.functional.pad(x, (0, BLOCK - V % BLOCK), value=float("-inf"))
    blocks = x.view(M, -1, BLOCK)  # [M, V / BLOCK, BLOCK]
    row, block = (blocks.amax(dim=2) >= low[:, None]).nonzero(as_tuple=True)  # [b] each
    inside, column = (blocks[row, block] >= low[row, None]).nonzero(as_tuple=True)  # [n] each
    return row[inside], block[inside] * BLOCK + column


def _bf16_at_least(x: torch.Tensor) -> torch.Tensor:
    """Positive x [V] float32 rounded to bf16 values no smaller than x."""
    rounded = x.to(torch.bfloat16)
    up = (rounded.view(torch.int16) + 1).view(torch.bfloat16)  # the next bf16 above a positive value
    return torch.where(rounded.float() >= x, rounded.float(), up.float())


def screen_for(weight: torch.Tensor, head, bias: torch.Tensor | None = None) -> GreedyScreen | None:
    """A screen over the head `head` with weight [V, D], or None where it would not keep the head's argmax: a bf16
    CPU head on a CPU without native bf16 (its products run ATen's kernel, kernels.aten_bf16_products), without a
    bias, where torch's int8 kernel runs and the logits of a few rows alone are the bits the whole head gives
    them (asked once, here). A native-bf16 CPU multiplies by oneDNN's packed head, which promises no such thing."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or weight.is_meta or bias is not None:
        return None
    if kernels.cpu_paths().native_bf16 or not kernels.cpu_paths().int8:
        return None
    with kernels.aten_bf16_products(weight.device, weight.dtype):
        if not subset_keeps_bits(head, weight):
            return None
    return GreedyScreen(weight, head)


def subset_keeps_bits(head, weight: torch.Tensor) -> bool:
    """Whether `head`'s logits of some vocabulary rows, computed alone, are the bits the whole head gives them, for
    1 to 9 input rows and 1 to 257 vocabulary rows (asked once at load, on fixed random inputs)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(9, weight.shape[1], generator=generator).to(weight.dtype)  # [9, D]
    for count in (1, 2, 3, 5, 9):
        whole = head(x[:count]).float()  # [count, V]
        for size in (1, 2, 3, 8, 17, 64, 257):
            ids = torch.randperm(weight.shape[0], generator=generator)[:size].sort().values
            part = torch.nn.functional.linear(x[:count], weight.detach()[ids]).float()
            if not torch.equal(whole[:, ids], part):
                return False
    return True
