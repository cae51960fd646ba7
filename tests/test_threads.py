"""threads.py: work on a passing thread leaves no OpenMP team behind (Linux, libgomp), and its result or error
comes back to the caller."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from blockdraft.threads import on_passing_thread


def test_returns_the_value_and_reraises_the_error():
    assert on_passing_thread(lambda: 41 + 1) == 42
    with pytest.raises(KeyError, match="missing"):
        on_passing_thread(lambda: {}["missing"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc; libgomp is Linux's")
def test_a_passing_thread_takes_its_openmp_team_with_it():
    # A fresh process, whose main thread has run no parallel region yet. A product on a passing thread leaves the
    # thread count where it was; the same product on the main thread leaves its team behind (the control: a
    # helper that ran fn on the caller's thread would fail the first assert).
    script = textwrap.dedent("""
        import os, time, torch
        from blockdraft.threads import on_passing_thread
        torch.set_num_threads(2)
        a = torch.randn(1024, 1024)
        count = lambda: len(os.listdir("/proc/self/task"))

        def settled(want):  # threads told to exit leave /proc a moment later, on a busy machine up to seconds
            deadline = time.monotonic() + 20
            while count() != want and time.monotonic() < deadline:
                time.sleep(0.05)
            return count()

        before = count()
        on_passing_thread(lambda: a @ a)
        passing = settled(before)
        a @ a
        print(before, passing, count())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    before, passing, after = map(int, out.stdout.split())
    assert passing == before, "the passing thread's OpenMP team must end with it"
    assert after > before, "control: a product on the main thread starts a team that stays"
