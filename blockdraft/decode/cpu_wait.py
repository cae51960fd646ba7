"""How long this process's threads waited for a CPU while something was timed: what tells a busy machine from a
slow one when step costs are measured (costs.py, measure.py).

Step times alone cannot tell them apart: a job that holds the cores at every step slows every step, and a table
timed beside it prices steps as a slower machine would, with the ratios between kinds bent too (the fixed delays
of waiting for a CPU stretch a short plain step more than a long drafted one). One q4 table timed beside a
2-thread job priced a drafted step of 8 nodes at 1.89 plain steps against 3.48 on the quiet machine, so a decode
drafts where it loses.

The kernel counts, per thread, the time it was ready to run but waited for a CPU (`run_delay`, the second field
of /proc/<pid>/task/<tid>/schedstat, in nanoseconds). Summed over this process's threads across a measurement and
divided by its wall time and the threads torch runs, it is the share of the measurement our threads spent
waiting (`wait_share`): 0.00 timing 64x576 @ 576x1536 products on 2 threads on a quiet 2-core Ice Lake VM, 0.39
beside a 2-thread job at nice 10, 0.62-0.80 at a lower priority than that job. Where schedstat is missing
(macOS, Windows, a kernel built without it) the share is None: unknown, and a measurement is taken as quiet
(the plain-step probe at load, costs.stale_cache_note, still names a cache far slower than now).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# A measurement whose threads waited for a CPU this share of the time or more ran on a busy machine.
BUSY_SHARE = 0.1


def waited_seconds() -> float | None:
    """Seconds this process's threads have waited for a CPU so far, summed over the threads alive now (a thread
    started later counts from its start); None where the kernel does not say."""
    total, read = 0, 0
    try:
        tasks = list(Path(f"/proc/{os.getpid()}/task").iterdir())
    except OSError:  # no /proc: not Linux
        return None
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[1])
            read += 1
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile, or no schedstat
            continue
    return total / 1e9 if read else None


def wait_share(waited: float, wall: float, threads: int) -> float:
    """The share of `wall` seconds that `threads` threads spent waiting for a CPU, given `waited` seconds of
    waiting summed over them: 0 (never waited) to 1 (waited all the time)."""
    if wall <= 0 or threads < 1:
        return 0.0
    return min(max(waited / (wall * threads), 0.0), 1.0)


class WaitWatch:
    """`with WaitWatch(threads) as watch: ...` then `watch.share`: the share of the block's wall time that
    `threads` threads of this process spent waiting for a CPU (`wait_share`), None where unknown."""

    def __init__(self, threads: int) -> None:
        self.threads, self.share = threads, None

    def __enter__(self) -> WaitWatch:
        self._waited, self._start = waited_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall, waited = time.perf_counter() - self._start, waited_seconds()
        if self._waited is not None and waited is not None:
            self.share = wait_share(waited - self._waited, wall, self.threads)


def busy(share: float | None) -> bool:
    """Whether a measurement whose threads waited `share` of the time ran on a busy machine (None: unknown, not
    busy)."""
    return share is not None and share >= BUSY_SHARE
