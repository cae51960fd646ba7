"""A graceful stop: on SIGTERM (or a first Ctrl-C) the server drains, ends what is left cleanly, and exits 0.

uvicorn's own SIGTERM closes the listening socket at once (new clients see "connection refused", and a load
balancer cannot tell a draining server from a dead one), cancels streams still running after its timeout (their
clients see a cut connection), and re-raises the signal once it is done, so the process exits with status 143,
not 0. Instead, the first signal drains:
1. the worker admits no new request: /v1 routes answer 503 naming the shutdown, /health answers 503 "draining";
2. queued and running requests are served for up to `grace` seconds;
3. whatever is still running then ends: a stream with an error event and `data: [DONE]`, a whole answer with a
   503; the worker thread stops;
4. uvicorn shuts down as usual (the lifespan's worker.stop finds nothing left) and `run` returns.
A second signal is uvicorn's own quick exit.
"""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from .worker import Worker

log = logging.getLogger("blockdraft.server")

POLL_SECONDS = 0.05  # how often the drain looks whether the worker is idle
STOP_JOIN_SECONDS = 5.0  # the worker ends the running batch after its current step; a step takes well under this
CLOSE_SECONDS = 5.0  # uvicorn's own wait for connections after the drain: only final events are still being sent


def serve(app, *, host: str, port: int, grace: float, log_level: str = "info") -> None:
    """Run `app` (from create_app) on host:port until SIGTERM or Ctrl-C, then drain for up to `grace` seconds."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=CLOSE_SECONDS)
    DrainingServer(config, app.state.worker, grace).run()


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose first SIGTERM or SIGINT drains the worker before the usual shutdown."""

    def __init__(self, config: uvicorn.Config, worker: Worker, grace: float) -> None:
        super().__init__(config)
        self.worker, self.grace = worker, grace
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._drain_task: asyncio.Task | None = None  # held here: the loop keeps only a weak reference to a task

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._loop is None or self._draining or self.should_exit:
            super().handle_exit(sig, frame)  # before serving, or a second signal: uvicorn's quick exit
            return
        self._draining = True

        def start() -> None:
            self._drain_task = self._loop.create_task(self.drain())

        # A signal handler interrupts the loop's own code: it only schedules work, through the thread-safe entry.
        self._loop.call_soon_threadsafe(start)

    async def drain(self) -> None:
        worker, loop = self.worker, asyncio.get_running_loop()
        worker.close()
        log.info("shutting down: new requests are refused; waiting up to %g s for %d queued and the running ones",
                 self.grace, worker.queue_depth)
        deadline = loop.time() + self.grace
        while not worker.idle and loop.time() < deadline:
            await asyncio.sleep(POLL_SECONDS)
        if not worker.idle:
            log.warning("the shutdown grace of %g s is over: ending the requests still running", self.grace)
        await asyncio.to_thread(worker.stop, STOP_JOIN_SECONDS)
        self.should_exit = True
