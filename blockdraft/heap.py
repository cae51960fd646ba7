"""Giving the heap's free pages back during training (glibc's `malloc_trim`).

glibc serves a request of at least its mmap threshold (128 KiB at start) from a mapping of its own, returned to the
system on free. But each time such a block is freed, glibc raises the threshold to that block's size (up to 32 MiB),
so from then on blocks of that size come from the heap instead. A training step's tensors change size with every
batch's sequence lengths (activations of [4, S, 576], features of [S, 1152]): they land in the heap, and the holes
they leave keep their pages, which the next steps' other sizes only partly reuse. Measured (Intel Xeon model 167,
`benchmarks/heap_policy.py`, 1 thread, eager): a run's anonymous memory grew from 0.3 to 5.6 GB in 150 s; two
compiled 1-thread runs side by side reached 8.3 GB each in 10 minutes and kept rising (docs/history.md §19).

`trim()` after an optimizer step hands those free pages back (glibc walks the heap and releases every whole free
page), so the run holds what it uses: 2.5 GB in the same 150 s. Keeping the threshold at 128 KiB instead
(`MALLOC_MMAP_THRESHOLD_`) holds memory as low but maps and faults in every large tensor afresh, a third of the
steps lost to the kernel. Nothing here changes what is computed. Where the C library has no `malloc_trim` (macOS,
Windows, musl), nothing is done.
"""

from __future__ import annotations

import ctypes
import sys


def trim() -> bool:
    """Give the heap's free pages back to the system; True where glibc released some."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # a C library without it
        return False
    malloc_trim.argtypes, malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return bool(malloc_trim(0))
