"""A fixed mmap threshold for glibc's heap in the long batch jobs (`train`, `features`, `data`).

glibc serves a request of at least its mmap threshold (128 KiB at start) from a mapping of its own, returned to the
system on free. But each time such a block is freed, glibc raises the threshold to that block's size (up to 32 MiB),
so from then on blocks of that size come from the heap instead. A training step's tensors change size with every
batch's sequence lengths (activations of [4, S, 576], features of [S, 1152]): they land in the heap, their holes no
longer fit the next step's sizes, and the heap grows without end. Measured (Intel Xeon model 167, 2 threads, two
1-thread training runs over the feature stores side by side, `--compile auto`): anonymous memory 8.3 GB per run
after 10 minutes and still rising 0.1-0.5 GB a minute, enough to exhaust 24 GB within the hour; with the threshold
fixed at 128 KiB, 2.4-2.9 GB and flat (docs/history.md §19).

Setting the threshold with `mallopt` also turns its raising off, as `MALLOC_MMAP_THRESHOLD_` in the environment does;
the trim threshold is set beside it so that the heap's free top goes back too. Nothing changes what is computed.
Where the C library has no `mallopt` (macOS, Windows, musl's stub), nothing is done.

No torch import here: the commands call it before they load anything.
"""

from __future__ import annotations

import ctypes
import sys

THRESHOLD = 128 * 1024  # glibc's own starting value, now kept
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h


def fix_mmap_threshold(nbytes: int = THRESHOLD) -> bool:
    """Keep glibc's mmap (and trim) threshold at `nbytes` for the rest of the process; True where that took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, nbytes)) and bool(mallopt(_M_TRIM_THRESHOLD, nbytes))
