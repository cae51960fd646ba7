"""Torch's thread pool warmed before any result counts: the first elementwise cos a process splits over its threads
must not round apart.

On an Intel Ice Lake (2 threads, torch 2.13.0) the first `cos` of a process that torch split over its threads
computed the second thread's half otherwise in about 1 process in 2, up to 1.5e-4 apart: the RoPE tables of the
first prefill, whose layer-1 features then rounded apart in bf16, so the same request took one of two texts from
process to process. Every later call agreed, and one throwaway `cos` over every thread first removed it (16 of 16
processes; docs/design.md §14, benchmarks/results/2026-12-07-stage25/first_prefill.py). torch splits such ops in
blocks of `BLOCK` elements, so the throwaway call holds one block a thread. It runs once per thread count: a pool
made larger later has new threads, warmed before its next RoPE table.

Called where RoPE tables are computed (the target's forward, the draft's `rope_cos_sin`), the only cos and sin of a
forward; a few microseconds, once.
"""

from __future__ import annotations

import torch

BLOCK = 2048  # elements per task of torch's elementwise cos and sin over contiguous floats
_WARMED: set[int] = set()  # thread counts already warmed in this process


def warm_threads() -> None:
    """Run one throwaway `cos` over every thread of torch's pool, once per thread count (never inside a compiled
    graph: there the compiler writes a cos of its own)."""
    if torch.compiler.is_compiling():
        return
    threads = torch.get_num_threads()
    if threads not in _WARMED:
        _throwaway(threads)
        _WARMED.add(threads)


def _throwaway(threads: int) -> None:
    torch.linspace(0.0, 100.0, BLOCK * threads).cos_()  # [BLOCK * threads]: one block a thread
