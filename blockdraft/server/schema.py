"""OpenAI-shaped requests, responses and errors; every request field we do not implement is refused by name.

Requests are validated strictly (`extra="forbid"`, no string-to-number coercion). A field the OpenAI API has
but blockdraft cannot honour (n > 1, logprobs, tools, penalties, ...) is declared here only so that its neutral
value is accepted (clients often send `n: 1` or `presence_penalty: 0`); any other value is a 400 naming it.
Sampling fields go through `SamplingParams`, the library's one validator, so the server and the Python API
refuse the same values with the same messages. Defaults follow OpenAI: temperature 1, top_p 1; chat
`max_tokens` defaults to the rest of the context (capped by the server limit), completions to 16.

The server's `max_tokens` limit reaches the validators as the validation context: `{"max_tokens_limit": N}`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..sampling import SamplingParams

MAX_STOP_STRINGS = 4  # OpenAI's limit; each one is matched against the growing text after every step
ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error", 500: "server_error",
               503: "server_error", 504: "timeout_error"}


class ApiError(Exception):
    """A request answered with an error: HTTP status and OpenAI's error object (plus the request id)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers  # extra response headers (Retry-After on a 429)

    def body(self, request_id: str) -> dict:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code,
                          "request_id": request_id}}


def _unsupported(field: str, got: Any, fix: str) -> PydanticCustomError:
    # The message is a template: passing the text as context keeps braces in `got` (a logit_bias dict) literal.
    text = f"`{field}` is not supported by blockdraft serve, got {got!r}; {fix}"
    return PydanticCustomError("unsupported_parameter", "{text}", {"text": text})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_unset(cls, data):
        # OpenAI's API reads null as "not set", and clients send it ("temperature": null). Unknown fields keep
        # their null, so that they are still refused by name.
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}
        return data


class StreamOptions(Strict):
    include_usage: bool = False


class TextPart(Strict):
    type: Literal["text"]
    text: str


class Message(Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def as_dict(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return {"role": self.role, "content": text}


class CompletionFields(Strict):
    """The fields chat and text completions share: model, budget, sampling, stopping, streaming."""

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # not in OpenAI's API; vLLM's name and meaning (0 = off)
    min_p: float = 0.0  # likewise
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # an end-user tag for the caller's records; it changes no output
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    @field_validator("temperature", "top_p", "top_k", "min_p", "seed")
    @classmethod
    def _sampling(cls, value, info: ValidationInfo):
        # InputError is a ValueError: pydantic reports it under this field with the library's own message.
        SamplingParams(**{info.field_name: value})
        return value

    @field_validator("max_tokens", "max_completion_tokens", check_fields=False)
    @classmethod
    def _budget(cls, value, info: ValidationInfo):
        name, limit = info.field_name, (info.context or {}).get("max_tokens_limit")
        if value is not None and value < 1:
            raise ValueError(f"`{name}` must be at least 1, got {value}; ask for one or more new tokens")
        if value is not None and limit is not None and value > limit:
            raise ValueError(f"`{name}` is {value}, over this server's limit of {limit}; ask for at most "
                             f"{limit} (the server sets it with --max-tokens-limit)")
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_STRINGS or not all(stops):
            raise ValueError(f"`stop` must be at most {MAX_STOP_STRINGS} non-empty strings, got {value!r}; "
                             "drop the empty or extra ones")
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value):
        if value != 1:
            raise _unsupported("n", value, "send one request per choice (n must be 1)")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value, info: ValidationInfo):
        # Penalties are not implemented: accepting a nonzero one would return unpenalised text as if it were.
        if value != 0:
            raise _unsupported(info.field_name, value, "leave it at 0 or omit it")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value):
        if value:
            raise _unsupported("logit_bias", value, "omit it or send an empty object")
        return value

    @model_validator(mode="after")
    def _usage_needs_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("`stream_options` applies to streamed responses only; set `stream` to true or drop it")
        return self

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, seed: int | None = None) -> SamplingParams:
        """This request's sampling parameters; the seed is passed apart because the worker owns row seeds."""
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, seed)


class ChatCompletionRequest(CompletionFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Literal["none"] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, value, info: ValidationInfo):
        if value:
            raise _unsupported(info.field_name, value, "omit it (log-probabilities are not returned)")
        return value

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value):
        if value:
            raise _unsupported("tools", f"{len(value)} tool(s)", "omit it (tool calling is not implemented)")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value):
        if value is not None and value != {"type": "text"}:
            raise _unsupported("response_format", value, 'use {"type": "text"} or omit it')
        return value

    @model_validator(mode="after")
    def _one_budget(self):
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise ValueError(f"`max_tokens` ({self.max_tokens}) and `max_completion_tokens` "
                                 f"({self.max_completion_tokens}) disagree; send only one of them")
            self.max_tokens = self.max_completion_tokens
        return self


class CompletionRequest(CompletionFields):
    prompt: str | list[int]
    max_tokens: int | None = 16  # OpenAI's default for text completions
    logprobs: int | None = None
    best_of: int | None = None
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value):
        if len(value) == 0:
            raise ValueError("`prompt` is empty; give some text or at least one token id")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value):
        if value is not None:
            raise _unsupported("logprobs", value, "omit it (log-probabilities are not returned)")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value):
        if value not in (None, 1):
            raise _unsupported("best_of", value, "omit it or use 1")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value):
        if value:
            raise _unsupported("echo", value, "omit it; the prompt is not repeated in the output")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value):
        if value:
            raise _unsupported("suffix", value, "omit it (insertion is not implemented)")
        return value


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


@dataclass
class Reply:
    """Builds the response objects of one request, as a whole or as stream chunks, chat or text shaped."""

    request_id: str
    model: str
    chat: bool
    created: int = 0

    def __post_init__(self) -> None:
        self.created = self.created or int(time.time())

    def _envelope(self, choices: list[dict], chunk: bool) -> dict:
        if self.chat:
            kind, prefix = ("chat.completion.chunk" if chunk else "chat.completion"), "chatcmpl-"
        else:
            kind, prefix = "text_completion", "cmpl-"
        return {"id": prefix + self.request_id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices}

    def chunk(self, text: str | None, finish_reason: str | None = None) -> dict:
        """One stream chunk; chat's first chunk (text None) carries the assistant role, its last an empty delta."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if text is None else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._envelope([choice], chunk=True)

    def usage_chunk(self, usage: Usage) -> dict:
        """The last chunk when the client asked for `stream_options.include_usage`: no choices, only usage."""
        return {**self._envelope([], chunk=True), "usage": usage.as_dict()}

    def whole(self, text: str, finish_reason: str, usage: Usage) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._envelope([choice], chunk=False), "usage": usage.as_dict()}
