"""The one thread that owns the model: it takes queued requests, decodes them as one batch, sends tokens back.

Batching. The worker waits for a request, then takes every queued request that can share its batch, up to
`max_batch`, and decodes them with one `stream(...)` call. Requests share a batch when
- their sampling parameters are equal, seed aside: one `Selector` (one SamplingParams) serves the whole batch,
  and each row gets its own seed, so a seeded request draws the same numbers alone or batched;
- they sample the same way: a seeded sample is coupled (the target-alone sample of its seed), an unseeded one
  drawn by rejection with a random seed;
- the batch fits the context: the longest prompt plus the largest `max_tokens` must fit `target.max_positions`
  (the caches are sized for it). Each row decodes its own `max_tokens` and then leaves the batch.
Requests that arrive while a batch runs join it as its rows finish (continuous batching: `stream(admit=)`), in
arrival order, while the oldest queued request is one that can join: same sampling parameters and width mode, a
free row, and
prompt plus `max_tokens` within the batch's room (its own need, at least JOIN_ROOM positions, at most the
context). A request that cannot join stops the joining, so it is never overtaken: it leads the next batch.

Cancelling. A client that disconnects, or a row that reached a stop string, cancels its own row: the worker
sends it nothing more, and `stream` drops the row after the step in progress, so it stops costing compute.
Once every row of a batch is cancelled or done, the batch stops at once.

Failures. An exception in a batch fails that batch's unfinished requests (each gets a `Failed` event, answered
with a 500 and its request id); the worker logs it and goes on with the next batch.

Load. At most `max_queue` requests wait; past that `submit` raises QueueFull (a 429), so an overload is refused at
once instead of growing a backlog no client will wait for. The worker starts by measuring step costs (warmup.py)
and, until every batch-size bucket is known, lets a batch have only the rows measured so far, with no joining.
`close` stops admitting (a 503) while queued and running requests are still served; `stop` ends the running batch
after its current step, and every unfinished request gets a `Failed` event with status 503.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import weakref
from collections import deque
from contextlib import closing
from dataclasses import dataclass, replace

from ..decode.decoder import Decoder
from ..decode.generate import Admission
from ..decode.options import DecodeOptions
from ..metrics import AcceptanceStats
from ..sampling import SamplingParams
from .outbox import Outbox
from .prometheus import ServerMetrics
from .warmup import Warmup

log = logging.getLogger("blockdraft.server")

JOIN_ROOM = 1024  # positions (prompt plus max_tokens) a batch's caches keep for requests joining it, at least
SHUTDOWN = "the server shut down before this request finished; retry against a running server"


class QueueFull(Exception):
    """`submit` refused a request: `max_queue` requests are waiting already."""


class Closed(Exception):
    """`submit` refused a request: the server is shutting down (or measuring costs failed)."""


@dataclass
class Tokens:
    tokens: list[int]  # newly committed tokens of this request (may be empty on the last event)
    finish_reason: str | None  # "stop" or "length" on the request's last event


@dataclass
class Failed:
    message: str  # what went wrong in the batch, for the error response
    status: int = 500  # 500: decoding failed; 503: the server stopped before the request finished


class Job:
    """One request's row: its input, and the channel that carries its events back to the event loop."""

    def __init__(self, request_id: str, prompt: list[int], max_tokens: int, sampling: SamplingParams,
                 loop: asyncio.AbstractEventLoop, outbox: Outbox | None = None) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.max_tokens = max_tokens
        # Greedy ignores every filter, so all greedy requests share one key; sampled ones group without the seed.
        self.group = SamplingParams() if sampling.greedy else replace(sampling, seed=None)
        self.seed = None if sampling.greedy else (sampling.seed if sampling.seed is not None else secrets.randbits(63))
        self.coupled = DecodeOptions(sampling=sampling).coupled  # what the sampler "auto" picks (see above)
        self.loop = loop
        self.outbox = Outbox(loop) if outbox is None else outbox  # the worker's, shared by the loop's jobs
        self.events: asyncio.Queue = asyncio.Queue()
        self.sent = 0  # tokens sent so far (worker thread only)
        self.done = False  # finished or failed (worker thread only)
        self.cancelled = False  # set on the event loop, read by the worker: nothing more is sent

    def cancel(self) -> None:
        self.cancelled = True

    async def next_event(self) -> Tokens | Failed:
        return await self.events.get()

    def deliver(self, tokens: list[int], finish_reason: str | None) -> None:
        """Send a row's new tokens, cut to this request's own budget (the batch may decode further)."""
        if self.done:
            return
        room = self.max_tokens - self.sent
        if len(tokens) > room:  # the batch's budget is larger; a stop token past ours is not ours
            tokens, finish_reason = tokens[:room], "length"
        elif len(tokens) == room and finish_reason is None:
            finish_reason = "length"
        self.sent += len(tokens)
        self.done = finish_reason is not None
        self._send(Tokens(tokens, finish_reason))

    def fail(self, message: str, status: int = 500) -> None:
        if not self.done:
            self.done = True
            self._send(Failed(message, status))

    def _send(self, event) -> None:
        if self.cancelled:
            return
        try:
            self.outbox.put(self.events, event)
        except RuntimeError:  # the request's event loop is closed: nobody is listening any more
            self.cancelled = True


class Worker:
    def __init__(self, decoder: Decoder, *, max_batch: int, max_queue: int = 64) -> None:
        self.decoder = decoder
        self.target = decoder.target
        self.block_size = decoder.block_size()
        self.max_batch = max_batch
        self.max_queue = max_queue
        self._outboxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # by event loop
        # Every batch decodes with the decoder's options (adaptive token trees with lookups grafted on, unless the
        # server was started otherwise) and fresh width policies: a request's widths follow its own acceptance
        # and the cost model measured once (in this thread, warmup.py), never what earlier requests did, so the
        # same request gives the same tokens every time (docs/design.md §14).
        self.warmup = Warmup(decoder, max_batch)
        self.warmed_once = threading.Event()  # set once requests can be served, or measuring failed
        self.metrics = ServerMetrics(self.block_size)  # the worker records batches; the app renders them
        self.active_rows = 0  # rows the running decode keeps (worker thread writes, /metrics reads)
        self._pending: deque[Job] = deque()
        self._ready = threading.Condition()
        self._closed = False  # no new requests (draining for a shutdown)
        self._stopping = False  # the thread ends: queued requests failed, the running batch ends after its step
        self._busy = False  # a batch is decoding
        self._thread = threading.Thread(target=self._loop, name="blockdraft-worker", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    @property
    def idle(self) -> bool:
        """Nothing decoding and nothing waiting (requests whose clients left do not count)."""
        with self._ready:
            return not self._busy and all(job.cancelled for job in self._pending)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Admit no new request; the queued and running ones are still served."""
        with self._ready:
            self._closed = True

    def stop(self, timeout: float = 30.0) -> None:
        """Fail the queued requests, end the running batch after its current step (its unfinished rows fail with
        a 503), and end the thread."""
        with self._ready:
            self._closed = self._stopping = True
            waiting, self._pending = list(self._pending), deque()
            self._ready.notify()
        for job in waiting:
            job.fail(SHUTDOWN, status=503)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, request_id: str, prompt: list[int], max_tokens: int, sampling: SamplingParams) -> Job:
        """Queue one request (call it on the event loop that will read the job's events). Raises Closed while
        shutting down and QueueFull when `max_queue` requests are waiting."""
        loop = asyncio.get_running_loop()
        outbox = self._outboxes.get(loop)
        if outbox is None:
            outbox = self._outboxes[loop] = Outbox(loop)
        job = Job(request_id, prompt, max_tokens, sampling, loop, outbox)
        with self._ready:
            if self._closed:
                raise Closed(self.warmup.error or "the server is shutting down")
            if len(self._pending) >= self.max_queue:  # those whose clients left first make room
                self._pending = deque(queued for queued in self._pending if not queued.cancelled)
            if len(self._pending) >= self.max_queue:
                raise QueueFull(f"{len(self._pending)} requests are waiting, this server's limit (--max-queue "
                                f"{self.max_queue})")
            self._pending.append(job)
            self._ready.notify()
        return job

    def _loop(self) -> None:
        try:
            self._warm()  # bucket 1 first: no request can be priced before it
        finally:
            self.warmed_once.set()
        while (batch := self._take_batch(self.warmup.rows, wait=self.warmup.done)) is not None:
            if batch:
                self._run(batch)
            del batch  # the finished requests are not kept alive while the worker waits for the next one
            if not self.warmup.done:
                self._warm()  # the next bucket, between batches (none runs meanwhile)

    def _warm(self) -> None:
        try:
            self.warmup.next()
        except Exception as error:  # nothing can be priced: refuse everything, and say why on /health
            log.exception("measuring step costs failed")
            self.warmup.error = (f"measuring step costs failed ({type(error).__name__}: {error}); see the server "
                                 "log, fix the cause and restart the server")
            with self._ready:
                self._closed = self._stopping = True
                waiting, self._pending = list(self._pending), deque()
            for job in waiting:
                job.fail(self.warmup.error, status=503)

    def _take_batch(self, limit: int | None = None, wait: bool = True) -> list[Job] | None:
        """Block until a request is queued; return it with every queued request that can share its batch, up to
        `limit` rows (default: max_batch). `wait=False` returns [] at once when nothing is queued. None: stop."""
        limit = limit or self.max_batch
        with self._ready:
            while True:
                while self._pending and self._pending[0].cancelled:
                    self._pending.popleft()  # its client left before the decode started
                if self._pending or self._stopping or not wait:
                    break
                self._ready.wait()
            if self._stopping:
                return None
            if not self._pending:
                return []
            batch = [self._pending.popleft()]
            longest, budget = len(batch[0].prompt), batch[0].max_tokens
            for job in list(self._pending):
                if len(batch) == limit:
                    break
                fits = max(longest, len(job.prompt)) + max(budget, job.max_tokens) <= self.target.max_positions
                if job.group == batch[0].group and job.coupled == batch[0].coupled and fits and not job.cancelled:
                    batch.append(job)
                    self._pending.remove(job)
                    longest, budget = max(longest, len(job.prompt)), max(budget, job.max_tokens)
            self._busy = True
            return batch

    def _take_joining(self, group: SamplingParams, coupled: bool, room: int, free: int) -> list[Job]:
        """Queued requests that join the running batch now: in arrival order, up to `free`, stopping at the first
        one that cannot join (another group or sampler, or over `room` positions), which then leads the next
        batch."""
        joining = []
        with self._ready:
            while self._pending and len(joining) < free and not self._stopping:
                job = self._pending[0]
                other = job.group != group or job.coupled != coupled
                if not job.cancelled and (other or len(job.prompt) + job.max_tokens > room):
                    break
                self._pending.popleft()
                if not job.cancelled:  # a client that left before its decode started is dropped here
                    joining.append(job)
        return joining

    def _run(self, batch: list[Job]) -> None:
        stats = [AcceptanceStats(self.block_size) for _ in batch]
        try:
            self._decode(batch, stats)
        except Exception as error:  # one bad batch must not take the server down with it
            log.exception("decode failed for requests %s", ", ".join(job.request_id for job in batch))
            for job in batch:
                job.fail(f"{type(error).__name__}: {error}")
        finally:
            if self._stopping:  # rows stopped before they finished end with a 503 (a no-op for finished ones)
                for job in batch:
                    job.fail(SHUTDOWN, status=503)
            self.active_rows, self._busy = 0, False
            pooled = stats[0]
            for more in stats[1:]:
                pooled = pooled.merge(more)
            self.metrics.add_batch(len(batch), pooled)

    def _decode(self, batch: list[Job], stats: list[AcceptanceStats]) -> None:
        group, coupled = batch[0].group, batch[0].coupled
        # A user's seed samples coupled (sampling/gumbel.py): the request gets the target-alone sample of its seed,
        # whatever it is batched with; an unseeded sample draws by rejection from its own random seed.
        options = replace(self.decoder.options, sampling=group, sampler="coupled" if coupled else "rejection")

        # While costs are still measured a batch takes no joining rows: it holds at most the rows measured (so it
        # is priced as on a warm server), and it ends soon, so that the next bucket is measured (warmup.py).
        warm = self.warmup.done

        def live() -> int:  # the rows the decode keeps after its next drop
            return sum(not (job.done or job.cancelled) for job in batch)

        def drop() -> list[int]:  # rows whose clients left (or timed out): gone before the next step
            self.active_rows = live()
            return [i for i, job in enumerate(batch) if job.cancelled]

        def admit(room: int) -> list[Admission]:  # queued requests joining as rows free up; `batch` grows
            joining = self._take_joining(group, coupled, room, self.max_batch - live()) if warm else []
            batch.extend(joining)
            self.active_rows = live()
            return [Admission(job.prompt, job.max_tokens, job.seed) for job in joining]

        self.active_rows = len(batch)
        # Each row has its own budget, and a row whose client went away stops costing compute at once.
        events = self.decoder.stream([job.prompt for job in batch], max_new_tokens=[job.max_tokens for job in batch],
                                     options=options, seeds=None if group.greedy else [job.seed for job in batch],
                                     stats=stats, drop=drop, admit=admit, room=JOIN_ROOM,
                                     max_rows=self.max_batch if warm else len(batch))
        with closing(events):  # leaving early (every row done or cancelled, or a stop) ends the decode there
            for event in events:
                batch[event.row].deliver(event.tokens, event.finish_reason)
                if self._stopping or all(job.done or job.cancelled for job in batch):
                    break
