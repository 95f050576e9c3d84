"""The OpenAI request bodies the gateway and ``toolrl serve`` accept (plus vLLM's extensions that a
token-exact client needs), the errors they answer with, and what identifies a message a client sends
back. Unknown OpenAI parameters (``user``, ``metadata``...) are accepted and ignored."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(Body):
    name: str
    arguments: str = "{}"


class RequestToolCall(Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[RequestToolCall] | None = None
    tool_call_id: str | None = None


class StreamOptions(Body):
    include_usage: bool = False


class _Sampling(Body):
    model: str
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=64)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM: logprob tokens as "token_id:N" (exact ids for the client).
    return_tokens_as_token_ids: bool = False

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    # vLLM's sampling extensions. prompt_logprobs: each prompt token's log-prob (and the k most likely).
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool = False


class RequestError(Exception):
    """A request refused: HTTP ``status`` with an OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        if self.status == 401:
            kind = "authentication_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.status}}


M = TypeVar("M", bound=BaseModel)


def parse_body(raw: bytes, model: type[M]) -> M:
    """A request body as ``model``; a RequestError naming the first bad field."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not JSON: {exc}") from None
    return validated(model, data)


def validated(model: type[M], data: Any, where: str = "") -> M:
    """``data`` (at ``where`` in the request) as ``model``; a RequestError naming its first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join([*filter(None, [where]), *(str(p) for p in first["loc"])])
        raise RequestError(f"{loc}: {first['msg']}" if loc else first["msg"], param=loc or None) from None


# Reasoning a client may drop from an assistant turn it sends back.
_REASONING = re.compile(r"<think>.*?</think>", re.DOTALL)


def message_key(message: ChatMessage) -> str:
    """What identifies a message when a client sends it back: its role, its text (without reasoning
    blocks, outer whitespace) and its calls (names and arguments as JSON values), not call ids or
    formatting. An image part counts by its data, so a message keeps its key only with the same image."""
    content = message.content if isinstance(message.content, str) or message.content is None \
        else "".join(str(p.get("text", "")) if p.get("type") == "text"
                     else f"<{hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest()}>"
                     for p in message.content)
    calls = []
    for call in message.tool_calls or []:
        try:
            arguments = json.dumps(json.loads(call.function.arguments or "{}"), sort_keys=True)
        except json.JSONDecodeError:
            arguments = call.function.arguments
        calls.append([call.function.name, arguments])
    role = "system" if message.role == "developer" else message.role
    text = _REASONING.sub("", content or "") if role == "assistant" else content or ""
    return json.dumps([role, text.strip(), calls])


def is_assistant_key(key: str) -> bool:
    return key.startswith('["assistant"')


def sse(data: dict[str, Any]) -> str:
    """One server-sent event of a streamed response."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
