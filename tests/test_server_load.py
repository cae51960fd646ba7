"""The server under load and faults, against uvicorn on a loopback port: a bounded queue (429 with Retry-After),
a request timeout (504, or a final error event), a client that leaves mid-stream (its row freed at the next step,
as /metrics shows), a SIGTERM that drains and exits 0 (`blockdraft serve` in a subprocess), and a slow soak test.

Unlike the in-process tests these bind real sockets: a disconnect, a signal and a process's exit status exist
only there. Decodes are slowed on purpose (`slowed`), so that a request is still running when the test acts.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from blockdraft.decode import decoder as decoder_module
from blockdraft.server import create_app
from blockdraft.server.responses import Answer
from blockdraft.server.worker import Job

from server_client import (CHAT, MODEL, TEXT, chat_body, http_status, loopback, sse_payloads, streamed_text, text_body,
                           wait_for)


def gauge(client, name: str) -> float:
    """A metric without labels from GET /metrics."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"/metrics has no {name}")


def slowed(monkeypatch, seconds: float, gate: threading.Event | None = None) -> list[int]:
    """Every decode waits `seconds` after each event (and, with `gate`, for the gate before its first event);
    returns the list of tokens per event delivered, to tell how far decodes ran."""
    committed, real = [], decoder_module.stream

    def slow(*args, **kwargs):
        if gate is not None:
            gate.wait(timeout=60)
        for event in real(*args, **kwargs):
            committed.append(len(event.tokens))
            yield event
            time.sleep(seconds)

    monkeypatch.setattr(decoder_module, "stream", slow)
    return committed


def test_a_full_queue_answers_429_with_retry_after(model, monkeypatch):
    """One request decodes, `max_queue` wait; the next is refused at once, and is served once the queue drains."""
    gate = threading.Event()
    slowed(monkeypatch, 0.0, gate)
    app = create_app(*model, model_id=MODEL, max_batch=1, max_queue=2)
    with loopback(app) as client, ThreadPoolExecutor(3) as pool:
        running = pool.submit(client.post, TEXT, json=text_body("run", max_tokens=4))
        wait_for(lambda: gauge(client, "blockdraft_active_rows") == 1)
        queued = [pool.submit(client.post, TEXT, json=text_body(f"wait {i}", max_tokens=4)) for i in range(2)]
        wait_for(lambda: app.state.worker.queue_depth == 2)
        refused = client.post(TEXT, json=text_body("one too many"), timeout=30)
        assert refused.status_code == 429, "a request past --max-queue must be refused, not queued"
        assert refused.headers["retry-after"].isdigit() and int(refused.headers["retry-after"]) > 0
        error = refused.json()["error"]
        assert error["code"] == "queue_full" and error["type"] == "rate_limit_error"
        assert "--max-queue 2" in error["message"] and "retry" in error["message"], "name the limit and the fix"
        gate.set()
        assert [f.result(timeout=60).status_code for f in [running, *queued]] == [200, 200, 200]
        assert 'blockdraft_requests_total{route="/v1/completions",status="429"} 1' in client.get("/metrics").text


def test_request_timeout_ends_queued_and_streamed_requests_and_frees_their_rows(model, monkeypatch):
    """A stream past the timeout ends with an error event and [DONE]; a request still queued then gets a 504."""
    slowed(monkeypatch, 0.2)  # 100 tokens take 2.5 s at least (8 per step): well past the 1 s timeout
    app = create_app(*model, model_id=MODEL, max_batch=1, max_tokens_limit=400, request_timeout=1.0)
    with loopback(app) as client, ThreadPoolExecutor(2) as pool:
        stream = pool.submit(client.post, TEXT, json=text_body("long", max_tokens=100, stream=True))
        wait_for(lambda: gauge(client, "blockdraft_active_rows") == 1)
        started = time.monotonic()
        whole = client.post(TEXT, json=text_body("queued behind", max_tokens=100))  # no row free: it waits
        assert whole.status_code == 504, "a request past --request-timeout must end with a 504"
        assert time.monotonic() - started < 10
        error = whole.json()["error"]
        assert error["code"] == "timeout" and "--request-timeout of 1 s" in error["message"]
        payloads = sse_payloads(stream.result(timeout=60))  # ends with data: [DONE]
        assert payloads[-1]["error"]["code"] == "timeout", "a stream past the timeout ends with an error event"
        assert streamed_text(payloads[:-1], chat=False), "the stream sent text before its timeout"
        wait_for(lambda: gauge(client, "blockdraft_active_rows") == 0 and app.state.worker.queue_depth == 0,
                 timeout=10)


def test_a_client_that_leaves_mid_stream_frees_its_row(model, monkeypatch):
    """The row of a client that disconnects leaves the decode at the next step, and /metrics shows it."""
    committed = slowed(monkeypatch, 0.1)  # 300 tokens take 4 s at least (8 per step)
    app = create_app(*model, model_id=MODEL, max_tokens_limit=400)
    with loopback(app) as client:
        with httpx.Client(base_url=str(client.base_url), timeout=60) as leaving:
            with leaving.stream("POST", TEXT, json=text_body("bye", max_tokens=300, stream=True)) as response:
                # The first line may come before the worker takes the row: wait for the row. The line iterator is
                # kept: dropped, it would close the connection at once (the client leaving before the gauge is read).
                lines = response.iter_lines()
                next(lines)
                wait_for(lambda: gauge(client, "blockdraft_active_rows") == 1, timeout=60,
                         describe=lambda: f"active rows {gauge(client, 'blockdraft_active_rows')}, "
                                          f"{sum(committed)} tokens decoded, {len(committed)} events")
        # The connection is closed (the response was not read to its end).
        wait_for(lambda: gauge(client, "blockdraft_active_rows") == 0, timeout=60,
                 describe=lambda: f"active rows {gauge(client, 'blockdraft_active_rows')}")
        decoded = sum(committed)
        time.sleep(0.5)
        assert sum(committed) == decoded, "the decode went on after its only row was freed"
        assert decoded < 300, f"the row decoded {decoded} tokens, all of them, instead of stopping"
        assert client.post(TEXT, json=text_body("next")).status_code == 200


SERVE_SLOWLY = """
import sys, time
from blockdraft.decode import decoder
from blockdraft.decode.costs import linear_costs

costs = linear_costs(plain=1.0, draft=1 / 3, per_position=0.02)  # the tests' fixed step costs: nothing timed
decoder.measured_costs = lambda *args, **kwargs: costs
real = decoder.stream

def slow(*args, **kwargs):  # a long stream is still running when SIGTERM comes
    for event in real(*args, **kwargs):
        yield event
        time.sleep(0.2)

decoder.stream = slow
from blockdraft.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_drains_refuses_new_requests_and_exits_zero(model_folders, tmp_path):
    """`blockdraft serve` in a subprocess: after SIGTERM new requests get 503, a short stream still finishes, a
    long one ends with an error event and [DONE] when the grace is over, and the process exits 0."""
    target, draft = model_folders
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-c", SERVE_SLOWLY, "serve", "--target", target, "--draft", draft, "--dtype",
               "float32", "--device", "cpu", "--threads", "1", "--port", str(port), "--max-tokens-limit", "400",
               "--shutdown-grace", "4"]
    env = {**os.environ, "BLOCKDRAFT_CACHE": str(tmp_path)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            wait_for(lambda: process.poll() is not None or http_status(client, "/health") == 200, timeout=180)
            assert process.poll() is None, process.stdout.read()
            model_id = client.get("/v1/models").json()["data"][0]["id"]
            body = {"model": model_id, "prompt": "go", "temperature": 0, "stream": True}
            with ThreadPoolExecutor(2) as pool:
                long = pool.submit(client.post, TEXT, json={**body, "max_tokens": 300})  # 300 / 8 * 0.2 s > 4 s
                wait_for(lambda: client.get("/health").json()["queue_depth"] == 0 and
                         "blockdraft_active_rows 1" in client.get("/metrics").text)
                short = pool.submit(client.post, TEXT, json={**body, "prompt": "gone", "max_tokens": 4})
                wait_for(lambda: "blockdraft_active_rows 2" in client.get("/metrics").text)
                process.send_signal(signal.SIGTERM)
                wait_for(lambda: client.get("/health").json()["status"] == "draining", timeout=10)
                refused = client.post(TEXT, json={**body, "stream": False, "max_tokens": 2})
                assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
                finished = sse_payloads(short.result(timeout=60))
                assert finished[-1]["choices"][0]["finish_reason"] in ("stop", "length"), (
                    "a stream that can finish within the grace must finish, not be cut")
                ended = sse_payloads(long.result(timeout=60))  # ends with data: [DONE]
        assert "shut down before this request finished" in ended[-1]["error"]["message"], (
            "a stream still running after the grace must end with an error event")
        assert process.wait(timeout=60) == 0, process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def soak_bodies() -> list[dict]:
    """Distinct well-formed requests: greedy and seeded, text and chat, with and without stop strings."""
    bodies = [text_body(f"Soak {i} " + "ab" * i, max_tokens=4 + 2 * i) for i in range(10)]
    bodies += [chat_body(f"Chat {i}", max_tokens=8 + i) for i in range(6)]
    bodies += [text_body(f"Seed {i}", temperature=0.8, top_k=20, seed=i, max_tokens=12) for i in range(6)]
    bodies += [text_body("Stops", stop=["a", "e"], max_tokens=24), text_body([5, 17, 33, 8, 41], max_tokens=16)]
    return bodies


MALFORMED = [(b"{not json", 400), (b'{"model": "tiny", "prompt": "x", "best_of_all": 3}', 400),
             (b'{"model": "tiny", "prompt": [5, 9999]}', 400), (b'{"model": "other", "prompt": "x"}', 404),
             (b'{"model": "tiny", "prompt": "x", "max_tokens": 100000}', 400)]


def answer_text(response, body: dict) -> str:
    chat = "messages" in body
    if body.get("stream"):
        return streamed_text(sse_payloads(response), chat)
    choice = response.json()["choices"][0]
    return choice["message"]["content"] if chat else choice["text"]


def live_requests() -> list:
    gc.collect()
    return [o for o in gc.get_objects() if type(o) in (Job, Answer)]


@pytest.mark.slow
def test_soak_mixed_requests_keep_their_text_and_memory(model):
    """Hundreds of mixed requests at once (streamed, whole, cancelled, malformed), float32 on tiny models: every
    well-formed request gets its text alone, every malformed one its error, and memory stays flat."""
    import random

    import psutil

    bodies = soak_bodies()
    app = create_app(*model, model_id=MODEL, max_batch=8, max_queue=512, max_tokens_limit=64)
    with loopback(app) as client:
        alone = [answer_text(client.post(CHAT if "messages" in b else TEXT, json=b), b) for b in bodies]

        def one(i: int) -> str | None:
            """Request i of the soak; a problem as text, None when all is well."""
            rng = random.Random(i)
            kind, k = rng.random(), rng.randrange(len(bodies))
            body, route = {**bodies[k], "stream": kind < 0.4}, CHAT if "messages" in bodies[k] else TEXT
            if kind > 0.9:  # malformed
                raw, status = MALFORMED[i % len(MALFORMED)]
                response = client.post(TEXT, content=raw, headers={"content-type": "application/json"})
                return None if response.status_code == status else f"malformed {raw!r}: {response.status_code}"
            if kind > 0.75:  # cancelled: the client leaves after its first line
                with httpx.Client(base_url=str(client.base_url), timeout=60) as leaving:
                    with leaving.stream("POST", route, json={**body, "stream": True}) as response:
                        next(response.iter_lines())
                return None
            response = client.post(route, json=body)
            if response.status_code != 200:
                return f"request {k}: {response.status_code} {response.text[:200]}"
            text = answer_text(response, body)
            return None if text == alone[k] else f"request {k}: {text!r} != alone {alone[k]!r}"

        def soak(count: int) -> list[str]:
            with ThreadPoolExecutor(16) as pool:
                return [problem for problem in pool.map(one, range(count)) if problem]

        assert soak(100) == []
        before = psutil.Process().memory_info().rss
        assert soak(300) == []
        grown = psutil.Process().memory_info().rss - before
        wait_for(lambda: gauge(client, "blockdraft_active_rows") == 0 and app.state.worker.queue_depth == 0)
        deadline = time.monotonic() + 10  # the worker lets go of its last batch just after the gauge reads 0
        while (kept := live_requests()) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not kept, f"{len(kept)} requests' jobs or answers outlived them: the server keeps something per request"
    # 1,500 such requests measured 5-19 MiB over the first 100, without a trend: allocator pools, not a leak.
    assert grown < 32 << 20, f"memory grew by {grown >> 20} MiB over 300 requests: something is kept per request"
