"""The OpenAI-compatible server: routes, streaming, batching, failures, a real client.

Refusals of bad requests are in test_server_refusals.py, batching, cancelling and failures in
test_server_batching.py; all three share the fixtures in conftest.py and the request builders in server_client.py.

The server is a thin layer, so its outputs are checked against the library: a request's text is the
library's greedy decode of the same prompt, streamed chunks concatenate to the whole response, and requests
batched together each get what they get alone. Everything runs in-process on a tiny random target with a
character-level tokenizer built here; the one end-to-end test binds uvicorn to a loopback port.
"""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from blockdraft.decode.generate import generate

from blockdraft.decode.proposers import TargetAlone
from blockdraft.sampling import SamplingParams
from blockdraft.server import create_app
from blockdraft.server.stops import StopStrings
from blockdraft.io.prompts import encode_prompt

from server_client import CHAT, LIMIT, MODEL, TEXT, chat_body, sse_payloads, streamed_text, text_body, wait_for
from step_fakes import proposer


def library_reply(target, draft, prompt_ids, max_tokens):
    result = generate(target, proposer(target, draft), [prompt_ids], max_new_tokens=max_tokens)[0]
    return target.tokenizer.decode(result.tokens, skip_special_tokens=True), result


# Routes


def test_models_and_health(client):
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL] and models["object"] == "list"
    health = client.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["speculative"] is True


def test_chat_equals_library_greedy_with_usage(client, model):
    target, draft = model
    response = client.post(CHAT, json=chat_body())
    assert response.status_code == 200, response.text
    body = response.json()
    prompt = encode_prompt(target.tokenizer, [{"role": "user", "content": "Hello"}])
    text, result = library_reply(target, draft, prompt, 12)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": text}, "the server changed the decode"
    assert body["choices"][0]["finish_reason"] == result.finish_reason
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(result.tokens),
                             "total_tokens": len(prompt) + len(result.tokens)}
    assert body["id"] == "chatcmpl-" + response.headers["x-request-id"] and body["object"] == "chat.completion"


def test_completions_accept_text_and_token_ids(client, model):
    target, draft = model
    ids = [5, 17, 33, 8, 41]
    by_ids = client.post(TEXT, json=text_body(ids)).json()
    text, result = library_reply(target, draft, ids, 12)
    assert by_ids["choices"][0]["text"] == text and by_ids["usage"]["completion_tokens"] == len(result.tokens)
    by_text = client.post(TEXT, json=text_body("Once upon")).json()
    text, _ = library_reply(target, draft, target.tokenizer("Once upon")["input_ids"], 12)
    assert by_text["choices"][0]["text"] == text and by_text["object"] == "text_completion"


@pytest.mark.parametrize("route", [CHAT, TEXT])
def test_stream_chunks_concatenate_to_the_whole_response(client, route):
    chat = route == CHAT
    body = chat_body("Stream me") if chat else text_body("Stream me")
    whole = client.post(route, json=body).json()
    response = client.post(route, json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response)
    expected = whole["choices"][0]["message"]["content"] if chat else whole["choices"][0]["text"]
    assert streamed_text(payloads, chat) == expected, "streamed chunks must add up to the non-streamed text"
    if chat:
        assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    finishes = [c["finish_reason"] for p in payloads for c in p["choices"] if c["finish_reason"]]
    assert finishes == [whole["choices"][0]["finish_reason"]], "exactly one chunk carries the finish reason"
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"] == whole["usage"]
    assert {p["id"] for p in payloads} == {payloads[0]["id"]}


def test_stop_string_cuts_text_streamed_or_not(client):
    free = client.post(TEXT, json=text_body(max_tokens=24)).json()["choices"][0]["text"]
    assert len(free) >= 8, f"the tiny model should write some text, got {free!r}"
    stop = free[4:6]
    cut = free[: free.index(stop)]
    whole = client.post(TEXT, json=text_body(max_tokens=24, stop=[stop, "never-seen"])).json()
    assert whole["choices"][0] == {**whole["choices"][0], "text": cut, "finish_reason": "stop"}
    streamed = sse_payloads(client.post(TEXT, json=text_body(max_tokens=24, stop=stop, stream=True)))
    assert streamed_text(streamed, chat=False) == cut, "no part of a stop string may leak into the stream"


def test_stop_strings_hold_back_a_split_match():
    stops = StopStrings(["</end>"])
    assert stops.push("a </") == "a ", "the possible start of the stop string is held back"
    assert stops.push("en") == ""
    assert stops.push("d> more") == "" and stops.hit
    stops = StopStrings(["</end>"])
    assert stops.push("x </e") == "x " and stops.push("gg") == "</egg"
    assert stops.push("<") == "" and stops.flush() == "<", "a row's end releases what never became a stop string"


def test_metrics_expose_requests_tokens_latency_and_acceptance(client):
    client.post(CHAT, json=chat_body())
    text = client.get("/metrics").text
    assert 'blockdraft_requests_total{route="/v1/chat/completions",status="200"}' in text
    assert 'blockdraft_request_duration_seconds_bucket{route="/v1/chat/completions",le="+Inf"}' in text
    assert 'blockdraft_tokens_total{kind="completion"}' in text
    tau_count = next(line for line in text.splitlines() if line.startswith("blockdraft_tau_count"))
    assert int(tau_count.split()[-1]) > 0, "verify steps must be counted"
    assert text.count("blockdraft_acceptance_rate{position=") == 7, "one rate per proposal slot 1..K-1 (K=8)"
    assert 'blockdraft_tau_bucket{le="8"}' in text and "# TYPE blockdraft_tau histogram" in text


def test_seeded_sampling_is_reproducible(client):
    body = text_body(temperature=0.9, top_p=0.95, seed=1234, max_tokens=10)
    first, second = (client.post(TEXT, json=body).json()["choices"][0]["text"] for _ in range(2))
    assert first == second, "the same seed must give the same sample"


def test_a_seeded_sample_is_the_target_alone_sample_of_its_seed(client, model):
    """Seeded requests sample coupled: the speculative server returns what the target alone draws with that seed."""
    from blockdraft.decode.selection import Selector

    target, _ = model
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=4321)
    body = text_body("A seeded sample", temperature=0.9, top_p=0.95, seed=4321, max_tokens=12)
    served = client.post(TEXT, json=body).json()["choices"][0]["text"]
    ids = target.tokenizer("A seeded sample")["input_ids"]
    alone = generate(target, TargetAlone(), [ids], max_new_tokens=12, selector=Selector(sampling, 1, coupled=True))[0]
    assert served == target.tokenizer.decode(alone.tokens, skip_special_tokens=True), (
        "a seeded request's text is not the target-alone sample of its seed")


# The real thing: uvicorn on a loopback port, the official OpenAI client


def test_openai_client_against_uvicorn(model):
    import uvicorn
    from openai import OpenAI

    target, draft = model
    app = create_app(target, draft, model_id=MODEL, api_key="e2e-key", max_tokens_limit=LIMIT)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # the kernel picks a free port; the server takes the bound socket, no race
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: _healthy(port), timeout=60)
        openai = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="e2e-key", max_retries=0, timeout=60)
        assert [m.id for m in openai.models.list()] == [MODEL]
        messages = [{"role": "user", "content": "Hi there"}]
        whole = openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
        chunks = openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole.choices[0].message.content and whole.usage.completion_tokens > 0
        text = openai.completions.create(model=MODEL, prompt="Once", max_tokens=5, temperature=0)
        assert text.choices[0].finish_reason in ("stop", "length")
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    assert not thread.is_alive(), "uvicorn did not stop"


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_serve_command_defaults_to_loopback():
    from blockdraft.cli import build_parser

    args = build_parser(only="serve").parse_args(["serve", "--no-spec"])
    assert (args.host, args.port, args.max_batch, args.max_tokens_limit, args.no_spec) == ("127.0.0.1", 8000, 8,
                                                                                         4096, True)
