"""The server's batching, cancelling and failures: requests batched together each get what they get alone, a
reader that leaves stops its row, and a failed batch is a 500 while the server keeps serving.

Shared with test_server.py: the fixtures in conftest.py (a tiny random target, an in-process client) and the request
builders in server_client.py.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from blockdraft.decode import decoder as decoder_module
from blockdraft.decode.decoder import Decoder
from blockdraft.sampling import SamplingParams
from blockdraft.server import worker as worker_module
from blockdraft.server.worker import Tokens, Worker

from server_client import CHAT, TEXT, chat_body, sse_payloads, streamed_text, text_body, wait_for


def batched_together(client, monkeypatch, bodies) -> tuple[list[dict], list[int]]:
    """Send `bodies` at once while the worker is held in a one-row batch, so they queue and decode as one batch.

    Returns each request's choice and the sizes of the batches the worker ran meanwhile.
    """
    gate, sizes, real = threading.Event(), [], decoder_module.stream

    def gated(target, proposer, prompts, **kwargs):
        sizes.append(len(prompts))
        if len(sizes) == 1:
            gate.wait(timeout=60)  # hold the worker in its first batch while the others queue up
        yield from real(target, proposer, prompts, **kwargs)

    monkeypatch.setattr(decoder_module, "stream", gated)
    worker = client.app.state.worker
    with ThreadPoolExecutor(len(bodies) + 1) as pool:
        blocker = pool.submit(client.post, TEXT, json=text_body("hold", max_tokens=2))
        wait_for(lambda: sizes == [1])
        futures = [pool.submit(client.post, TEXT, json=b) for b in bodies]
        wait_for(lambda: worker.queue_depth == len(bodies))
        gate.set()
        choices = [f.result(timeout=120).json()["choices"][0] for f in futures]
        assert blocker.result(timeout=120).status_code == 200
    monkeypatch.undo()
    return choices, sizes


@pytest.mark.parametrize("join", [True, False], ids=["joining-the-running-batch", "next-batch"])
def test_concurrent_greedy_requests_each_match_alone(client, monkeypatch, join):
    """Eight requests queued behind a running batch join it as rows free up (or, with no room kept for joining,
    decode as the next batch); each gets what it gets alone."""
    bodies = [text_body(f"Prompt number {i} " + "ab" * i, max_tokens=6 + i) for i in range(8)]
    alone = [client.post(TEXT, json=b).json()["choices"][0] for b in bodies]
    if not join:
        monkeypatch.setattr(worker_module, "JOIN_ROOM", 0)  # the running batch's caches fit only its own row
    batched, sizes = batched_together(client, monkeypatch, bodies)
    expected = [1] if join else [1, 8]
    assert sizes == expected, f"expected decode calls of {expected} prompts, got {sizes}"
    for i, (one, many) in enumerate(zip(alone, batched)):
        assert many == one, f"request {i} changed when batched with others: {many} vs {one}"


def queued_worker(model, requests) -> Worker:
    """A worker that is not started (batches and joins are taken by hand) with `requests` queued in order:
    (id, prompt, max_tokens, sampling)."""
    worker = Worker(Decoder(*model), max_batch=8)

    async def queue() -> None:
        for request in requests:
            worker.submit(*request)

    asyncio.run(queue())
    return worker


def test_joining_keeps_arrival_order_and_never_overtakes(model):
    hot = SamplingParams(temperature=0.7)
    worker = queued_worker(model, [("a", [5] * 10, 20, SamplingParams()),
                                   ("b", [5] * 10, 500, SamplingParams()),  # over the room: stops the joining
                                   ("c", [5] * 10, 20, SamplingParams())])
    assert [job.request_id for job in worker._take_joining(SamplingParams(), False, 100, 8)] == ["a"]
    assert [job.request_id for job in worker._pending] == ["b", "c"]
    assert worker._take_joining(SamplingParams(), False, 1000, 1)[0].request_id == "b", "at most `free` rows join"
    assert worker._take_joining(hot, False, 1000, 8) == [], "another group never joins"
    seeded = queued_worker(model, [("d", [5] * 10, 20, replace(hot, seed=4))])
    assert seeded._take_joining(hot, False, 1000, 8) == [], "a seeded (coupled) sample never joins a rejection batch"
    assert [job.request_id for job in seeded._take_joining(hot, True, 1000, 8)] == ["d"]


def test_seeded_sampled_requests_match_alone_when_batched(client, monkeypatch):
    """Each row draws from its own seed, so a seeded request's sample does not depend on its batch mates."""
    bodies = [text_body(f"Sample {i}", temperature=0.8, top_k=20, seed=100 + i, max_tokens=8) for i in range(3)]
    alone = [client.post(TEXT, json=b).json()["choices"][0] for b in bodies]
    batched, sizes = batched_together(client, monkeypatch, bodies)
    assert sizes == [1, 3]
    assert batched == alone, "a seeded sample changed when its request shared a batch"


def test_batches_group_equal_sampling_that_fits_the_context(model):
    hot = SamplingParams(temperature=0.7)
    worker = queued_worker(model, [
        ("a", [5] * 10, 200, SamplingParams()),
        ("b", [5] * 10, 20, replace(hot, seed=1)),
        ("c", [5] * 10, 20, SamplingParams(top_p=0.5)),  # greedy ignores top_p: a's group
        ("d", [5] * 10, 20, replace(hot, seed=2)),  # seeds differ, parameters equal: b's group
        ("e", [5] * 400, 20, SamplingParams()),  # 400 + a's 200 > 512 positions: waits
        ("f", [5] * 10, 20, replace(hot, top_k=5)),
        ("g", [5] * 10, 20, hot),  # b's parameters without a seed: its widths may adapt, b's may not
        ("h", [5] * 10, 20, hot),
    ])
    batches = [[job.request_id for job in worker._take_batch()] for _ in range(5)]
    assert batches == [["a", "c"], ["b", "d"], ["e"], ["f"], ["g", "h"]]


def test_the_same_request_gives_the_same_text_every_time_streamed_or_not(client, monkeypatch):
    """Widths follow each request's own acceptance and the cost model measured once, never earlier requests or
    the clock: a request repeated gives the same text, and a streamed answer the non-streamed one."""
    monkeypatch.setattr(worker_module.secrets, "randbits", lambda bits: 12345)  # the unseeded request's seed
    for body in (text_body("Again and again", max_tokens=16), text_body("Seeded", temperature=0.9, seed=5,
                                                                         max_tokens=10),
                 text_body("Free", temperature=0.9, max_tokens=10)):
        texts = [client.post(TEXT, json=body).json()["choices"][0]["text"] for _ in range(3)]
        assert len(set(texts)) == 1, f"one request, several texts: {texts}"
    whole = client.post(CHAT, json=chat_body()).json()["choices"][0]["message"]["content"]
    streamed = streamed_text(sse_payloads(client.post(CHAT, json=chat_body(stream=True))), chat=True)
    assert streamed == whole, "a streamed answer differs from the same request answered whole"


def test_worker_failure_is_a_500_with_id_and_the_server_keeps_serving(client, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("injected decode failure")

    monkeypatch.setattr(decoder_module, "stream", broken)
    response = client.post(CHAT, json=chat_body())
    assert response.status_code == 500
    error = response.json()["error"]
    request_id = response.headers["x-request-id"]
    assert error["request_id"] == request_id and request_id in error["message"]
    assert error["type"] == "server_error" and "injected decode failure" in error["message"]
    monkeypatch.undo()
    assert client.post(CHAT, json=chat_body()).status_code == 200, "the worker must survive a failed batch"
    assert client.get("/health").json()["status"] == "ok"


def test_failure_after_the_first_chunk_ends_the_stream_with_an_error_event(client, monkeypatch):
    real = decoder_module.stream

    def fails_later(*args, **kwargs):
        events = real(*args, **kwargs)
        yield next(events)
        raise RuntimeError("injected late failure")

    monkeypatch.setattr(decoder_module, "stream", fails_later)
    payloads = sse_payloads(client.post(CHAT, json=chat_body(stream=True)))
    assert "injected late failure" in payloads[-1]["error"]["message"]
    monkeypatch.undo()
    assert client.post(CHAT, json=chat_body()).status_code == 200


def test_cancelled_row_stops_its_batch(model, monkeypatch):
    """A reader that leaves cancels its row; a batch whose rows are all cancelled stops decoding."""
    target, draft = model
    committed, real = [], decoder_module.stream

    def counting(*args, **kwargs):
        for event in real(*args, **kwargs):
            committed.append(len(event.tokens))
            yield event

    monkeypatch.setattr(decoder_module, "stream", counting)

    async def scenario():
        worker = Worker(Decoder(target, draft), max_batch=4)
        worker.start()
        try:
            job = worker.submit("r1", [5, 6, 7], 200, SamplingParams())
            first = await asyncio.wait_for(job.next_event(), 60)
            job.cancel()
            done = worker.submit("r2", [5, 6, 7], 3, SamplingParams())  # runs only after the first batch has stopped
            while not (event := await asyncio.wait_for(done.next_event(), 60)).finish_reason:
                pass
            return first, event
        finally:
            await asyncio.to_thread(worker.stop)

    first, last = asyncio.run(scenario())
    assert isinstance(first, Tokens) and last.finish_reason in ("stop", "length")
    assert sum(committed) < 100, f"the cancelled row decoded {sum(committed)} tokens instead of stopping"
