"""The worker's outbox: a burst of events reaches the loop's queues in order, in one wake-up."""

from __future__ import annotations

import asyncio
import threading

import pytest

from blockdraft.server.outbox import Outbox


def test_a_burst_wakes_the_loop_once_and_keeps_every_order():
    async def main():
        loop = asyncio.get_running_loop()
        outbox, queues = Outbox(loop), [asyncio.Queue() for _ in range(16)]
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: wakeups.append(1) or real(*args)

        def step(n: int) -> None:  # the worker: one event per row, as a step delivers
            for row, queue in enumerate(queues):
                outbox.put(queue, (n, row))

        for n in range(3):  # three steps, each a burst while the loop is busy elsewhere
            worker = threading.Thread(target=step, args=(n,))
            worker.start()
            worker.join()
            await asyncio.sleep(0)  # the loop drains the burst
        assert len(wakeups) == 3, f"{len(wakeups)} wake-ups for 3 bursts of 16 events"
        for row, queue in enumerate(queues):
            assert [queue.get_nowait() for _ in range(3)] == [(n, row) for n in range(3)]
            assert queue.empty()

    asyncio.run(main())


def test_a_closed_loop_is_reported_and_a_later_put_tries_again():
    loop = asyncio.new_event_loop()
    outbox, queue = Outbox(loop), None
    loop.close()
    with pytest.raises(RuntimeError):
        outbox.put(queue, "lost")
    with pytest.raises(RuntimeError):  # not left as if a drain were due
        outbox.put(queue, "lost too")
