"""One request's answer: the worker's token events become text, then an OpenAI response, whole or streamed.

Text leaves through `TextStream` (never half a UTF-8 character) and then `StopStrings` (never part of a stop
string). Both the whole and the streamed answer are built from the same pieces, so the chunks of a stream
concatenate to exactly the text of the same request without streaming.

The answer waits for its first piece before the HTTP status is chosen, so a batch that fails at prefill still
gets a real 500. A stream that fails later has already sent 200; it ends with one `data: {"error": ...}` event.
A client that leaves (either kind of answer) cancels its row in the worker. With a `timeout`, a request not
finished within it gets a 504 (or, streaming, an error event and `data: [DONE]`) and cancels its row likewise.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..textstream import TextStream
from .prometheus import ServerMetrics
from .schema import ApiError, Reply, Usage
from .stops import StopStrings
from .worker import Failed, Job


class Answer:
    def __init__(self, job: Job, reply: Reply, tokenizer, stops: list[str], usage: Usage,
                 metrics: ServerMetrics, timeout: float | None = None) -> None:
        self.job, self.reply, self.usage, self.metrics = job, reply, usage, metrics
        self.timeout = timeout
        self.deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        self.pieces = self._pieces(TextStream(tokenizer), StopStrings(stops))
        self.first: tuple[str, str | None] = ("", None)

    async def start(self) -> None:
        """Wait for the first piece of text; raises ApiError (500) if the batch failed before it."""
        try:
            self.first = await anext(self.pieces)
        except BaseException:
            self.job.cancel()
            raise

    def stream(self, include_usage: bool) -> StreamingResponse:
        return StreamingResponse(self._events(include_usage), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})

    async def whole(self, request: Request) -> Response:
        """The non-streamed answer; a client that leaves before it is ready cancels its row (499, never sent)."""

        async def collect() -> JSONResponse:
            text, finish = self.first
            while finish is None:
                piece, finish = await anext(self.pieces)
                text += piece
            return JSONResponse(self.reply.whole(text, finish, self.usage))

        async def client_left() -> None:
            # The body is read, so the next ASGI message is the disconnect (or comes once the response is sent).
            while (await request.receive())["type"] != "http.disconnect":
                pass

        answer, leaving = asyncio.ensure_future(collect()), asyncio.ensure_future(client_left())
        try:
            await asyncio.wait({answer, leaving}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            leaving.cancel()
            answer.cancel()  # no effect once the answer is ready
            await asyncio.gather(answer, leaving, return_exceptions=True)  # `pieces` must be idle to close it
            await self._close()
        return Response(status_code=499) if answer.cancelled() else answer.result()

    async def _pieces(self, text: TextStream, stop: StopStrings):
        """(new text, finish_reason) pairs; the last one has the reason. ApiError 500 if the batch fails."""
        while True:
            event = await self._next_event()
            if isinstance(event, Failed) and event.status == 503:
                raise ApiError(503, event.message, code="unavailable")
            if isinstance(event, Failed):
                raise ApiError(500, f"decoding failed ({event.message}); the server keeps serving: retry, and "
                               f"report request id {self.job.request_id} if it repeats", code="internal_error")
            self.usage.completion_tokens += len(event.tokens)
            piece = stop.push(text.push(event.tokens))
            if event.finish_reason is not None and not stop.hit:
                piece += stop.push(text.flush())  # the rest of the text may still complete a stop string
                piece += stop.flush()
            if stop.hit:
                yield piece, "stop"
                return
            yield piece, event.finish_reason
            if event.finish_reason is not None:
                return

    async def _next_event(self):
        """The worker's next event for this request; ApiError 504 once the deadline has passed."""
        if self.deadline is None:
            return await self.job.next_event()
        try:
            return await asyncio.wait_for(self.job.next_event(), self.deadline - asyncio.get_running_loop().time())
        except asyncio.TimeoutError:
            raise ApiError(504, f"the request did not finish within this server's --request-timeout of "
                           f"{self.timeout:g} s; ask for fewer tokens (max_tokens), retry when the server is less "
                           "busy, or start it with a longer --request-timeout", code="timeout") from None

    async def _events(self, include_usage: bool):
        """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`."""
        reply = self.reply
        try:
            if reply.chat:
                yield _event(reply.chunk(None))  # the role comes first, alone, as OpenAI sends it
            piece, finish = self.first
            while True:
                if piece:
                    yield _event(reply.chunk(piece))
                if finish is not None:
                    yield _event(reply.chunk("", finish))
                    break
                piece, finish = await anext(self.pieces)
            if include_usage:
                yield _event(reply.usage_chunk(self.usage))
        except ApiError as error:
            yield _event(error.body(reply.request_id))
        finally:
            await self._close()
        yield "data: [DONE]\n\n"

    async def _close(self) -> None:
        self.job.cancel()  # done, stopped at a stop string, or nobody is reading: the worker sends it nothing more
        await self.pieces.aclose()
        self.metrics.add_tokens(self.usage.prompt_tokens, self.usage.completion_tokens)


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
