"""Events from the worker thread to the event loop's queues, one wake-up of the loop per burst.

A step delivers to every row of its batch at once. One `call_soon_threadsafe` per event would wake the loop once
per row (a write to its self-pipe each, the interpreter handed back and forth between the threads while the worker
has the next step to run); the outbox wakes it once, and the loop puts the burst into the queues in one go. Events
keep their order: per queue, and across queues.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque


class Outbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: deque = deque()  # (queue, event) not yet handed over
        self._scheduled = False  # a drain is due on the loop
        self._lock = threading.Lock()

    def put(self, queue: asyncio.Queue, event) -> None:
        """Hand `event` to `queue` on the loop (from any thread). Raises RuntimeError once the loop is closed."""
        with self._lock:
            self._items.append((queue, event))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            with self._lock:
                self._scheduled = False
            raise

    def _drain(self) -> None:  # on the loop
        with self._lock:
            items, self._items = self._items, deque()
            self._scheduled = False
        for queue, event in items:
            queue.put_nowait(event)
