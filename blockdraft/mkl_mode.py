"""MKL in its strict reproducible mode: a row's bits must not depend on the thread that computes it.

torch's CPU attention kernel splits a batch's (row, head) blocks over threads, each thread with a scratch buffer of
its own, and multiplies a decode step's few query rows (fewer than 4: SmolLM2's 3 query heads per key/value head at
one token) with MKL. Outside its strict mode MKL's few-row products depend on where a buffer lies in memory, so the
same row rounded apart on the second thread of a batch and on the first thread alone: under continuous batching
SmolLM2 answers parted in bf16 from the same request alone (docs/design.md §14). MKL's Conditional Numerical
Reproducibility in strict mode (`MKL_CBWR=AUTO,STRICT`: this CPU's own code path, results independent of
alignment) keeps them equal. No speed was lost at q4 or in bf16, and on an AMD EPYC float32 products of 8 rows ran
faster than under MKL's default dispatch (docs/history.md §7).

MKL reads the setting at its first call, so it is set when `blockdraft` is imported (a value the user set is kept);
`strict()` asks MKL which mode it runs, for the warning of `warn_unless_strict`.

No torch import at module level: this runs when the package is imported.
"""

from __future__ import annotations

import ctypes
import os
import warnings

ENV = "MKL_CBWR"
MODE = "AUTO,STRICT"
_ALL, _STRICT = -1, 0x10000  # MKL_CBWR_ALL (~0) and the MKL_CBWR_STRICT flag of mkl_service.h


def request() -> None:
    """Ask for strict mode before MKL's first call (nothing where the user chose a mode)."""
    os.environ.setdefault(ENV, MODE)


def strict() -> bool | None:
    """Whether MKL runs in strict mode; None where torch carries no MKL (ARM builds) or does not export its
    mode query."""
    import torch

    if not torch.backends.mkl.is_available():
        return None
    folder = os.path.join(os.path.dirname(torch.__file__), "lib")
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        try:
            query = ctypes.CDLL(os.path.join(folder, name)).mkl_serv_cbwr_get
        except (OSError, AttributeError):
            continue
        query.argtypes, query.restype = [ctypes.c_int], ctypes.c_int
        return bool(query(_ALL) & _STRICT)
    return None


_WARNED = False


def warn_unless_strict() -> None:
    """Warn once per process where MKL runs outside strict mode (torch ran MKL before `blockdraft` was imported,
    or $MKL_CBWR chose another mode)."""
    global _WARNED
    if _WARNED or strict() is not False:
        return
    _WARNED = True
    warnings.warn(
        f"MKL is not in its strict mode (${ENV}={os.environ.get(ENV, 'unset')}), so in bf16 a request's text can "
        f"depend on the requests batched with it; set {ENV}={MODE} before starting Python, or import blockdraft "
        "before anything runs a torch product", stacklevel=3)
