"""$BLOCKDRAFT_CPU: run on this machine as a CPU of another class would, to test that class's paths anywhere.

    BLOCKDRAFT_CPU=avx2          no AVX512, no native bf16 (AMD Zen 2/3, most laptops)
    BLOCKDRAFT_CPU=avx512        AVX512 without native bf16 (Intel Skylake-X to Ice Lake)
    BLOCKDRAFT_CPU=avx512-bf16   AVX512 with native bf16 (AMD Zen 4/5, Intel Cooper Lake and later)
    unset or auto                this machine as it is

A class can only take features away: on an AVX2 machine `avx512-bf16` changes nothing. Besides blockdraft's own
choices (model/kernels.py), the switch caps torch's and oneDNN's kernels at that class through their own
settings, ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA, which both read them at their first kernel call: set here
when `blockdraft` is imported, before any product runs (a value the user set already is kept).

No torch import here: this runs when the package is imported.
"""

from __future__ import annotations

import os

ENV = "BLOCKDRAFT_CPU"
# class -> (torch's ATEN_CPU_CAPABILITY, oneDNN's ONEDNN_MAX_CPU_ISA, whether bf16 products are native)
CLASSES = {
    "avx2": ("avx2", "AVX2", False),
    "avx512": ("avx512", "AVX512_CORE", False),
    "avx512-bf16": ("avx512", "AVX512_CORE_BF16", True),
}


def requested() -> str | None:
    """The class $BLOCKDRAFT_CPU asks for, or None (unset, empty or "auto": this machine as it is)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in CLASSES:
        # A typo would otherwise test this machine's own paths while claiming another class's.
        raise ValueError(f"${ENV} is {value!r}; use one of {', '.join(CLASSES)} or auto (or unset it)")
    return value


def apply() -> None:
    """Cap torch's and oneDNN's kernels at the requested class (nothing when none is requested)."""
    try:
        cpu_class = requested()
    except ValueError:  # refused by name where the paths are chosen (model/kernels.py), not at import
        return
    if cpu_class is None:
        return
    aten, onednn, _ = CLASSES[cpu_class]
    os.environ.setdefault("ATEN_CPU_CAPABILITY", aten)
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", onednn)
