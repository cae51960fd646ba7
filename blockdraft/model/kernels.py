"""The CPU fast paths this machine takes: decided once, from what its CPU can do, before any weight is loaded.

Every fast path has a fallback that computes the same function over the same weights, so a CPU without one runs
slower, never wrongly and never into a kernel's traceback:

| path | runs where | else |
|---|---|---|
| oneDNN packed bf16 linears (packed.py) | native bf16, and oneDNN's packing runs | `F.linear` over the same bf16 weights |
| bf16 as the automatic dtype (io/targets.py) | native bf16 products: AVX512-BF16 or AMX | float32 |
| int4 products of `--weights q4` (q4.py) | torch's CPU int4 kernel | `--weights q4` refused before loading |
| the TorchScript layer loop (scripted.py) | with the int4 products | the Python layer loop (target.py) |
| an int4 target's prompts over packed bf16 copies (prompt_path.py) | packed bf16 runs | the int4 products |
| `--weights auto` picks q4 (embedded target) | the int4 kernel | the float path of `--dtype auto` |
| a draft beside a bf16 target in bf16 (io/drafts.py) | native bf16 | the draft in float32 (`draft_dtype`) |
| a draft beside an int4 target as int4 products in bf16 (draft_q4.py) | the int4 kernel (as its target) | - |
| oneDNN's bf16 matmul in the target's forward (`aten_bf16_products`) | native bf16 | ATen's own bf16 kernel |
| greedy picks through an int8 screen of the head (screen.py) | no native bf16, and the int8 kernel runs | the whole head |

Each kernel is asked once, on a tiny product, whether it runs here: a CPU that lacks a feature (an AVX2 server,
an ARM machine) raises from the kernel, and is told apart by that alone, whatever its name. The answers are kept
for the process: a decode never chooses a kernel per step. $BLOCKDRAFT_CPU (cpu_switch.py) takes paths away as a
CPU of another class would lack them, so tests run every class's paths on one machine.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import torch

from .. import cpu_switch
from ..errors import ConfigError


@dataclass(frozen=True)
class CpuPaths:
    """Which fast paths this CPU takes (see the module's table)."""

    cpu_class: str  # "avx512-bf16", "avx512", "avx2", or torch's name for the ISA it dispatches to
    switched: bool  # $BLOCKDRAFT_CPU chose the class, not this machine
    native_bf16: bool  # bf16 products run in hardware: bf16 is fast
    packed_bf16: bool  # oneDNN's packed bf16 linear runs
    int4: bool  # torch's CPU int4 product runs
    int8: bool = True  # torch's CPU int8 product (bf16 rows, int8 weights) runs: the greedy screen (screen.py)

    @property
    def q4_pays(self) -> bool:
        """Whether `--weights auto` takes q4 on the embedded target: wherever the int4 kernel runs. A decode step
        reads every weight once, so it is bound by their bytes: the int4 layers and bf16 head are 120 MiB where
        float32 holds 540, and the target alone measured 3.2-4.4x float32's tokens/s with the kernels capped at
        AVX2 and at AVX512 without native bf16, though one in-cache int4 product is slower than float32's there
        (86 against 48 us for 1536x576 at one row, AVX2)."""
        return self.int4

    def describe(self) -> str:
        switched = f" (${cpu_switch.ENV})" if self.switched else ""
        return f"{self.cpu_class}{switched}, {'native' if self.native_bf16 else 'no native'} bf16"


@cache
def cpu_paths() -> CpuPaths:
    """This machine's paths, or those of the class $BLOCKDRAFT_CPU names (asked once per process)."""
    try:
        switched = cpu_switch.requested()
    except ValueError as error:
        raise ConfigError(str(error)) from None
    native = _native_bf16()
    detected = "avx512-bf16" if native else _isa_name()
    if switched is not None:  # a class only takes features away
        native = native and cpu_switch.CLASSES[switched][2]
    # Packing only where bf16 is native: with bf16 emulated (AVX512 without BF16) oneDNN's packed product at 2
    # threads rounded a 2-row product apart from F.linear's, so the packed copy would not be the same function.
    # With the kernels capped (cpu_switch.apply) the probe answers as on that class (AVX2: it raises).
    packed = native and _packed_bf16_runs()
    return CpuPaths(switched or detected, switched is not None, native, packed, _int4_runs(), _int8_runs())


def check_bf16_note(dtype: torch.dtype, device: torch.device) -> str | None:
    """One line for a bf16 run on a CPU without native bf16 products (it runs, slower); None otherwise."""
    if dtype != torch.bfloat16 or device.type != "cpu" or cpu_paths().native_bf16:
        return None
    return (f"note: this CPU ({cpu_paths().describe()}) has no native bf16 products: bf16 runs emulated, several "
            "times slower than float32; --dtype float32 is faster here and gives the target's own tokens")


def draft_dtype(target_dtype: torch.dtype, device: torch.device, int4: bool = False) -> torch.dtype:
    """The dtype a draft runs in beside a target of `target_dtype` (`int4`: whose layers are int4): the target's,
    except bf16 on a CPU without native bf16 products, where float32's are faster (an Ice Lake's 8-row 576x1536
    product took 370 us in bf16 against 226 in float32, 2 threads). Beside an int4 target the draft's own products
    are int4 too (draft_q4.py), which take bf16 inputs: it stays bf16. Only proposals change, never the output:
    the target verifies every token."""
    if int4:
        return target_dtype
    if target_dtype == torch.bfloat16 and torch.device(device).type == "cpu" and not cpu_paths().native_bf16:
        return torch.float32
    return target_dtype


@contextmanager
def aten_bf16_products(device: torch.device, dtype: torch.dtype):
    """Within it, the bf16 products on a CPU without native bf16 run ATen's own kernel instead of oneDNN's (as on
    an AVX2 CPU, where oneDNN's does not run): the target's forward enters it (model/target.py).

    Where bf16 is emulated, oneDNN's bf16 matmul rounds a row apart with the number of rows beside it and how its
    threads split them (an Ice Lake, 2 threads: SmolLM2's head at 1-3 and every odd row count from 5 on, its MLP
    projections at 2-35 rows), so a request's tokens depended on its batch-mates (1 of 8 HumanEval answers equal
    to the prompt alone) and a verify block's rows on its length. ATen's kernel sums every output as a dot
    product of its own: the same bits at every row count and thread count (8 of 8), as fast at one row, slower at
    many (docs/design.md §14). Native bf16 (and every other dtype and device) keeps oneDNN."""
    if dtype != torch.bfloat16 or device.type != "cpu" or cpu_paths().native_bf16:
        yield
        return
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


def require_int4() -> None:
    """Refuse `--weights q4` before any load where the int4 kernel does not run."""
    if not cpu_paths().int4:
        raise ConfigError(f"--weights q4 needs torch's CPU int4 kernel, which does not run on this CPU "
                          f"({cpu_paths().describe()}, torch {torch.__version__}); use --weights auto or --dtype float32")


def _isa_name() -> str:
    capability = torch.backends.cpu.get_cpu_capability().lower()  # "AVX512", "AVX2", "DEFAULT", ...
    return "avx512" if capability.startswith("avx512") else capability


def _native_bf16() -> bool:
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def _packed_bf16_runs() -> bool:
    """Whether oneDNN packs and multiplies a bf16 weight here (it raises without AVX512 BW/VL/DQ or AVX-NE-CONVERT)."""
    mkldnn = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise")):
        return False
    try:
        weight = torch.ones(16, 16, dtype=torch.bfloat16)
        packed = mkldnn._reorder_linear_weight(weight, 8)
        out = mkldnn._linear_pointwise(torch.ones(2, 16, dtype=torch.bfloat16), packed, None, "none", [], "")
    except RuntimeError:
        return False
    return bool((out == 16).all())


def _int8_runs() -> bool:
    """Whether torch's CPU int8 product runs here (bf16 rows, an int8 weight, a bf16 scale a row)."""
    try:
        out = torch._weight_int8pack_mm(torch.ones(1, 64, dtype=torch.bfloat16), torch.ones(8, 64, dtype=torch.int8),
                                        torch.ones(8, dtype=torch.bfloat16))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return bool((out == 64).all())


def _int4_runs() -> bool:
    """Whether torch's CPU int4 product runs here, on a 64x64 weight of groups of 32."""
    try:
        codes = torch.full((64, 64), 9, dtype=torch.int32)  # (9 - 8) * 1 + 0 = 1 every weight
        packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
        scales_zeros = torch.stack([torch.ones(2, 64), torch.zeros(2, 64)], -1).to(torch.bfloat16)  # [G, N, 2]
        out = torch._weight_int4pack_mm_for_cpu(torch.ones(1, 64, dtype=torch.bfloat16), packed, 32, scales_zeros)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return bool((out == 64).all())
