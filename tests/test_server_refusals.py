"""The OpenAI-compatible server's refusals: each bad request gets the status and an error naming its field.

Shared with test_server.py: the fixtures in conftest.py (a tiny random target, an in-process client) and the request
builders in server_client.py.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from blockdraft.server import create_app

from server_client import BODY_LIMIT, CHAT, LIMIT, MODEL, TEXT, chat_body, text_body, wait_for

REFUSALS = [
    (CHAT, {"foo": 1}, "foo", "unknown_parameter"),
    (CHAT, {"n": 2}, "n", "unsupported_parameter"),
    (CHAT, {"logprobs": True}, "logprobs", "unsupported_parameter"),
    (CHAT, {"top_logprobs": 3}, "top_logprobs", "unsupported_parameter"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "unsupported_parameter"),
    (CHAT, {"response_format": {"type": "json_object"}}, "response_format", "unsupported_parameter"),
    (CHAT, {"presence_penalty": 0.5}, "presence_penalty", "unsupported_parameter"),
    (CHAT, {"frequency_penalty": -1}, "frequency_penalty", "unsupported_parameter"),
    (CHAT, {"logit_bias": {"5": 10}}, "logit_bias", "unsupported_parameter"),
    (CHAT, {"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    (CHAT, {"messages": []}, "messages", "invalid_value"),
    (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "invalid_value"),
    (CHAT, {"max_tokens": 3, "max_completion_tokens": 4}, "max_tokens", "invalid_value"),
    (TEXT, {"best_of": 2}, "best_of", "unsupported_parameter"),
    (TEXT, {"echo": True}, "echo", "unsupported_parameter"),
    (TEXT, {"suffix": "end"}, "suffix", "unsupported_parameter"),
    (TEXT, {"logprobs": 1}, "logprobs", "unsupported_parameter"),
    (TEXT, {"prompt": 7}, "prompt", "invalid_value"),
    (TEXT, {"prompt": [5, 999]}, "prompt", None),
    (TEXT, {"temperature": -0.5}, "temperature", "invalid_value"),
    (TEXT, {"temperature": "hot"}, "temperature", "invalid_value"),
    (TEXT, {"top_p": 0}, "top_p", "invalid_value"),
    (TEXT, {"top_p": 1.5}, "top_p", "invalid_value"),
    (TEXT, {"top_k": -1}, "top_k", "invalid_value"),
    (TEXT, {"min_p": 1.0}, "min_p", "invalid_value"),
    (TEXT, {"seed": -1}, "seed", "invalid_value"),
    (TEXT, {"max_tokens": 0}, "max_tokens", "invalid_value"),
    (TEXT, {"max_tokens": LIMIT + 1}, "max_tokens", "invalid_value"),
    (TEXT, {"max_tokens": "5"}, "max_tokens", "invalid_value"),
    (TEXT, {"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    (TEXT, {"stop": [""]}, "stop", "invalid_value"),
]


@pytest.mark.parametrize("route,change,param,code", REFUSALS, ids=[f"{r[0][4:]}-{r[2]}" for r in REFUSALS])
def test_refusal_names_the_field(client, route, change, param, code):
    body = {**(chat_body() if route == CHAT else text_body()), **change}
    response = client.post(route, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    # A check across two fields (max_tokens vs max_completion_tokens) has no single param; the message names it.
    assert error["param"] in (param, None) and f"`{param.split('[')[0]}" in error["message"], error
    assert error["code"] == code or code is None
    assert error["type"] == "invalid_request_error"
    assert error["request_id"] == response.headers["x-request-id"], "errors carry the request id"


def test_null_fields_mean_unset_but_unknown_fields_are_still_refused(client):
    nulls = {"n": None, "stop": None, "presence_penalty": None, "seed": None, "logit_bias": None, "user": None}
    response = client.post(CHAT, json=chat_body(**nulls))
    assert response.status_code == 200, response.text
    assert client.post(CHAT, json=chat_body(mystery=None)).json()["error"]["param"] == "mystery"


@pytest.mark.parametrize("route", [CHAT, TEXT])
def test_prompt_over_context_names_both_lengths(client, route):
    long = "x" * 500  # 500 characters -> at least 500 tokens; the tiny target's context is 512
    body = chat_body(long, max_tokens=20) if route == CHAT else text_body(long, max_tokens=20)
    error = client.post(route, json=body).json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "`max_tokens` is 20" in error["message"] and "context of 512" in error["message"], error
    prompt_tokens = int(error["message"].split("the prompt has ")[1].split(" tokens")[0])
    assert prompt_tokens >= 500


def test_chat_without_max_tokens_uses_the_rest_of_the_context(client):
    error = client.post(CHAT, json={**chat_body("y" * 520), "max_tokens": None}).json()["error"]
    assert error["code"] == "context_length_exceeded" and "at least 1 new token" in error["message"]


def test_body_over_the_limit_is_413(client):
    response = client.post(TEXT, json=text_body("z" * (BODY_LIMIT + 10)))
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    chunks = (b"{" + b" " * 1024 for _ in range(8))  # no Content-Length: the limit holds while reading
    assert client.post(TEXT, content=chunks).status_code == 413


@pytest.mark.parametrize("raw", [
    b"{not json", b"[1, 2]", b'{"model": "tiny", "temperature": NaN}', b"\xff\xfe",
    b'{"model": ' + b"[" * 1900 + b"]" * 1900 + b"}",  # nested past the parser's recursion limit
    b'{"model": "tiny", "prompt": "\\ud800 hi", "max_tokens": 3}',  # half a UTF-16 pair: no character
    b'{"model": "x\\udfff", "prompt": "hi", "max_tokens": 3}',
], ids=["syntax", "array", "nan", "bytes", "deep", "surrogate-prompt", "surrogate-model"])
def test_malformed_json_is_400(client, raw):
    response = client.post(TEXT, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json", response.text


def test_an_internal_error_answers_500_with_the_request_id(model, monkeypatch):
    import blockdraft.server.app as app_module

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    target, draft = model
    monkeypatch.setattr(app_module, "read_json", broken)
    with TestClient(create_app(target, draft, model_id=MODEL), raise_server_exceptions=False) as plain:
        response = plain.post(TEXT, json=text_body("hi"))
    request_id = response.json()["error"].get("request_id") or response.json().get("request_id")
    assert response.status_code == 500 and "RuntimeError" in response.json()["error"]["message"]
    assert response.headers.get("x-request-id") and response.headers["x-request-id"] in response.text
    assert request_id is None or request_id == response.headers["x-request-id"]


def test_unknown_model_and_route_are_404(client):
    error = client.post(TEXT, json=text_body(model="gpt-9")).json()["error"]
    assert error["code"] == "model_not_found" and "gpt-9" in error["message"] and MODEL in error["message"]
    response = client.get("/v2/nothing")
    assert response.status_code == 404 and "error" in response.json()


def test_api_key_is_required_on_v1_routes(model):
    target, draft = model
    with TestClient(create_app(target, draft, model_id=MODEL, api_key="s3cret")) as keyed:
        assert keyed.get("/v1/models").status_code == 401
        wrong = keyed.get("/v1/models", headers={"authorization": "Bearer guess"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert keyed.post(TEXT, json=text_body(), headers={"authorization": "Bearer guess"}).status_code == 401
        assert keyed.get("/v1/models", headers={"authorization": "Bearer s3cret"}).status_code == 200
        # Once warm (an empty cost cache makes /health say 503 "warming" first), the probe answers without a key.
        wait_for(lambda: keyed.get("/health").status_code == 200, describe=lambda: keyed.get("/health").json())
