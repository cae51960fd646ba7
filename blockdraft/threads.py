"""One thread for torch's CPU work in a process of several threads (the server).

PyTorch's CPU build on Linux runs its parallel kernels on libgomp (GNU OpenMP), which gives every thread that
enters a parallel region an OpenMP team of its own, alive as long as that thread. Once the process's teams hold
more threads than the machine has cores, libgomp "throttles": every team's threads stop spinning between parallel
regions and sleep at once, so each of a decode step's hundreds of small products waits for a wake-up. Measured
(AMD EPYC Zen 5, 2 cores, `--threads 2`, float32, 8 streaming clients): a server whose main thread had loaded the
draft, leaving a team there, decoded at 0.77-0.83x the same server without it, its decode thread switching out
about 3,000 times a second.

So the server builds everything on a passing thread: `on_passing_thread` runs a function on a thread that ends
when it returns, and libgomp frees that thread's team with it. The decode thread then owns the only team.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_passing_thread(fn: Callable[[], T], name: str = "blockdraft-load") -> T:
    """fn() on a new thread that ends when fn returns (or raises, re-raised here), taking with it any OpenMP team
    the call started; the caller's thread starts none."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread below
            outcome["error"] = error

    thread = threading.Thread(target=run, name=name, daemon=True)  # a Ctrl-C meanwhile ends the process
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
