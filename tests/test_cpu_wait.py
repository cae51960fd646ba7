"""How long our threads waited for a CPU (decode/cpu_wait.py): the share's arithmetic, and the kernel's counts
read for real where Linux gives them."""

from __future__ import annotations

import os
import time

import pytest
import torch

from blockdraft.decode.cpu_wait import BUSY_SHARE, WaitWatch, busy, wait_share, waited_seconds

needs_schedstat = pytest.mark.skipif(waited_seconds() is None, reason="the kernel does not count run_delay here")


def test_the_share_is_waiting_over_the_threads_wall_time():
    assert wait_share(0.3, wall=1.0, threads=2) == pytest.approx(0.15), "0.3 s of 2 threads' 2 s"
    assert wait_share(5.0, wall=1.0, threads=2) == 1.0 and wait_share(-0.1, wall=1.0, threads=2) == 0.0
    assert wait_share(1.0, wall=0.0, threads=2) == 0.0, "nothing timed: nothing to say"
    assert busy(BUSY_SHARE) and not busy(BUSY_SHARE / 2) and not busy(None), "unknown is taken as quiet"


@needs_schedstat
def test_sleeping_is_not_waiting():
    with WaitWatch(1) as watch:
        time.sleep(0.2)
    assert watch.share is not None and watch.share < BUSY_SHARE, \
        f"a thread asleep waited {watch.share:.0%} for a CPU: a quiet machine would read as busy"


@needs_schedstat
def test_threads_beyond_the_cores_wait_for_them():
    """Four times as many busy threads as cores: each waits for a CPU most of the time, whatever else runs."""
    cores = os.cpu_count() or 1
    before = torch.get_num_threads()
    torch.set_num_threads(4 * cores)
    try:
        a = torch.randn(512, 512)
        with WaitWatch(4 * cores) as watch:
            for _ in range(40):
                a = torch.tanh(a @ a)
    finally:
        torch.set_num_threads(before)
    assert watch.share is not None and busy(watch.share), f"{4 * cores} threads on {cores} cores waited " \
        f"{watch.share:.0%} of the time: the kernel's count was not read"
