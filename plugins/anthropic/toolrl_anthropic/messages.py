"""Anthropic's Messages API on an episode's endpoint (``POST /e/{episode}/v1/messages``), served as the
chat turn it amounts to (:meth:`GatewaySession.turn`): :class:`AnthropicMessages`, a gateway protocol.
Its clients find the endpoint in ``ANTHROPIC_BASE_URL`` (the episode's root, without ``/v1``) and
``ANTHROPIC_API_KEY``; its errors are Anthropic's.

Blocks map to chat messages: ``system`` a leading system message; a user message's ``tool_result``
blocks one ``tool`` message each (``is_error`` as an ``Error:`` prefix), then its text as one user
message; an assistant message's text and ``tool_use`` blocks one message, whose key then matches the
reply served (:func:`toolrl.gateway.protocol.message_key`); ``thinking`` blocks are dropped, any other
block is a 400 naming it. A stop sequence that ended the reply is cut from its text and named in
``stop_sequence``. Sampling parameters are accepted and ignored (the rollout's are what is trained).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal

from pydantic import Field
from toolrl.gateway.protocol import Body, ChatMessage, RequestError, parse_body, validated
from toolrl.gateway.protocols import GatewayProtocol
from toolrl.gateway.session import Ask, Choice, GatewaySession, Turn


class _Message(Body):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class _Tool(Body):
    type: Literal["custom"] | None = None  # Anthropic's server tools (bash_..., web_search_...) are not served
    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class _ToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class MessagesRequest(Body):
    """A ``POST /v1/messages`` body."""

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[_Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool = False


class _Text(Body):
    text: str


class _ToolUse(Body):
    id: str
    name: str
    input: dict[str, Any]


class _ToolResult(Body):
    tool_use_id: str
    content: str | list[dict[str, Any]] = ""
    is_error: bool = False


def parse(raw: bytes) -> MessagesRequest:
    return parse_body(raw, MessagesRequest)


async def answer(session: GatewaySession, req: MessagesRequest) -> dict[str, Any]:
    """A ``Message``."""
    messages = anthropic_chat_messages(req)
    tools = [{"type": "function", "function": {"name": t.name, "parameters": t.input_schema, **(
        {"description": t.description} if t.description is not None else {})}} for t in req.tools or []]
    choice = req.tool_choice or _ToolChoice(type="auto")
    turn = await session.turn(messages, tools, Ask(
        n=1, max_tokens=req.max_tokens, stop=tuple(req.stop_sequences or ()), parse_calls=choice.type != "none",
        parallel_calls=not choice.disable_parallel_tool_use, tool=choice.name if choice.type == "tool" else None),
        id_prefix="msg", role=session.role_of(req.model))
    return message_body(turn, req.stop_sequences or (), req.model)


# -- the request, as OpenAI chat messages -------------------------------------------------------------


def anthropic_chat_messages(req: MessagesRequest) -> list[ChatMessage]:
    """The request's system prompt and messages as OpenAI chat messages."""
    out = []
    if req.system:
        out.append(ChatMessage(role="system", content=_text(req.system, "system", "\n\n")))
    for i, message in enumerate(req.messages):
        where = f"messages.{i}.content"
        if isinstance(message.content, str):
            out.append(ChatMessage(role=message.role, content=message.content))
        elif message.role == "assistant":
            out.append(_assistant(message.content, where))
        else:
            out += _user(message.content, where)
    return out


def _user(content: list[dict[str, Any]], where: str) -> list[ChatMessage]:
    results, texts = [], []
    for kind, block, at in _blocks(content, where, ("text", "tool_result")):
        if kind == "text":
            texts.append(validated(_Text, block, at).text)
            continue
        result = validated(_ToolResult, block, at)
        text = _text(result.content, f"{at}.content", "\n\n")
        results.append(ChatMessage(role="tool", tool_call_id=result.tool_use_id,
                                   content=f"Error: {text}" if result.is_error else text))
    if texts or not results:
        results.append(ChatMessage(role="user", content="\n\n".join(texts)))
    return results


def _assistant(content: list[dict[str, Any]], where: str) -> ChatMessage:
    texts, calls = [], []
    for kind, block, at in _blocks(content, where, ("text", "tool_use", "thinking", "redacted_thinking")):
        if kind == "text":
            texts.append(validated(_Text, block, at).text)
        elif kind == "tool_use":
            use = validated(_ToolUse, block, at)
            calls.append({"id": use.id, "function": {"name": use.name,
                                                      "arguments": json.dumps(use.input, ensure_ascii=False)}})
    # The text served was one block: joined as it was, so the message's key is the reply's.
    return ChatMessage.model_validate({"role": "assistant", "content": "".join(texts), "tool_calls": calls or None})


def _text(content: str | list[dict[str, Any]], where: str, sep: str) -> str:
    """A string, or text blocks' text joined by ``sep``."""
    if isinstance(content, str):
        return content
    return sep.join(validated(_Text, block, at).text for _, block, at in _blocks(content, where, ("text",)))


def _blocks(content: list[dict[str, Any]], where: str,
            kinds: Sequence[str]) -> Iterator[tuple[str, dict[str, Any], str]]:
    """Each block of ``content`` (at ``where``) as (its type, the block, where it is); a RequestError at
    the first whose type is not one of ``kinds``."""
    for j, block in enumerate(content):
        at, kind = f"{where}.{j}", block.get("type")
        if kind not in kinds:
            raise RequestError(f"{at}.type: {kind!r} blocks are not supported here (only {', '.join(kinds)})",
                               param=f"{at}.type")
        yield kind, block, at


# -- the answer, as Anthropic writes it ---------------------------------------------------------------


def message_body(turn: Turn, stop_sequences: Sequence[str], model: str) -> dict[str, Any]:
    """``turn``'s (first) choice as an Anthropic ``Message``."""
    choice = turn.choices[0]
    reason, sequence = _stop_reason(choice, stop_sequences)
    text = choice.message.get("content") or ""
    if sequence is not None:  # the engine keeps the stop string; Anthropic's text ends before it
        text = text.removesuffix(sequence)
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in choice.message.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": json.loads(call["function"]["arguments"])})
    return {"id": turn.id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence,
            "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": len(choice.generation.token_ids)}}


def _stop_reason(choice: Choice, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    gen = choice.generation
    if choice.finish == "tool_calls":
        return "tool_use", None
    if gen.finish_reason == "length":
        return "max_tokens", None
    if gen.finish_reason == "stop_string" and gen.stop in stop_sequences:
        return "stop_sequence", str(gen.stop)
    return "end_turn", None  # the end-of-turn token, or a parser's stop string


async def stream(req: MessagesRequest, body: dict[str, Any]) -> AsyncIterator[str]:
    """A ``Message`` as the server-sent events of its stream: each block whole in one delta."""
    usage = body["usage"]
    yield _event("message_start", message={**body, "content": [], "stop_reason": None, "stop_sequence": None,
                                           "usage": {**usage, "output_tokens": 0}})
    for i, block in enumerate(body["content"]):
        if block["type"] == "text":
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        yield _event("content_block_start", index=i, content_block=start)
        yield _event("content_block_delta", index=i, delta=delta)
        yield _event("content_block_stop", index=i)
    yield _event("message_delta", delta={"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]},
                 usage={"output_tokens": usage["output_tokens"]})
    yield _event("message_stop")


def _event(kind: str, **data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


def error_body(error: RequestError) -> dict[str, Any]:
    """A refusal as Anthropic's API writes it."""
    kind = {401: "authentication_error", 404: "not_found_error"}.get(error.status, "invalid_request_error")
    return {"type": "error", "error": {"type": "api_error" if error.status >= 500 else kind, "message": str(error)}}


class AnthropicMessages(GatewayProtocol):
    path = "messages"
    parse, answer, stream = staticmethod(parse), staticmethod(answer), staticmethod(stream)
    error_body = staticmethod(error_body)

    @staticmethod
    def environ(root: str, key: str) -> dict[str, str]:
        return {"ANTHROPIC_BASE_URL": root, "ANTHROPIC_API_KEY": key}  # what Anthropic's clients read
