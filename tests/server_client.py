"""Requests to the OpenAI-compatible server and the server on a real loopback socket (test_server,
test_server_refusals, test_server_batching, test_server_load, test_bench_serve): imported as
`from server_client import ...`; the in-process server itself is conftest.py's `client` fixture.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

MODEL = "tiny"
LIMIT = 64  # the server's max_tokens limit in these tests
BODY_LIMIT = 4096
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


def chat_body(content="Hello", **extra):
    """A greedy 12-token chat request with one user message; `extra` fields are added."""
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 12,
            **extra}


def text_body(prompt="Once upon", **extra):
    """A greedy 12-token completions request; `extra` fields are added."""
    return {"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 12, **extra}


def sse_payloads(response) -> list:
    """The JSON payloads of a server-sent event stream; the final `[DONE]` is checked and dropped."""
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]", "an OpenAI stream must end with data: [DONE]"
    return [json.loads(event) for event in events[:-1]]


def streamed_text(payloads, chat: bool) -> str:
    """The text of a stream's payloads, chunks concatenated (chat deltas or completion texts)."""
    key = (lambda c: c["delta"].get("content", "")) if chat else (lambda c: c["text"])
    return "".join(key(choice) for p in payloads for choice in p["choices"])


def wait_for(condition, timeout: float = 60.0, describe=None) -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds, saying `describe()` (what was seen last)."""
    deadline = time.monotonic() + timeout
    polls = 0
    while not condition():
        polls += 1
        assert time.monotonic() < deadline, (f"timed out waiting for the server after {polls} polls"
                                             + (f": {describe()}" if describe is not None else ""))
        time.sleep(0.01)


@contextmanager
def loopback(app):
    """Serve `app` with uvicorn in a thread on a free loopback port; yields an httpx client of it (test_server_load,
    test_bench_serve: a disconnect, a signal or a load generator's own client exist only on a real socket)."""
    import httpx
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # the kernel picks a free port; the server takes the bound socket, no race
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            wait_for(lambda: http_status(client, "/health") == 200)
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    assert not thread.is_alive(), "uvicorn did not stop"


def http_status(client, path: str) -> int | None:
    """The status of GET `path`; None while nothing answers."""
    import httpx

    try:
        return client.get(path, timeout=5).status_code
    except httpx.TransportError:
        return None
