"""``POST /v1/responses``: the OpenAI Responses API (the OpenAI Agents SDK's default model), served as
the chat turn it amounts to (:meth:`GatewaySession.turn`); ``parse``, ``answer`` and ``stream`` as in
:mod:`toolrl.gateway.chat_completions`.

``input`` items map to chat messages: ``function_call`` items right after an assistant message (or each
other) are that message's ``tool_calls``, so a reply the gateway served (its message item, then its
calls) keeps its key when sent back (``message_key``); ``reasoning`` items are dropped. What needs state
the gateway does not keep (``previous_response_id``, ``conversation``, a stored ``prompt``) and any other
item, part or tool is a 400 naming its field; unknown parameters are ignored, sampling is the rollout's.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import Field

from toolrl.gateway.protocol import Body, ChatMessage, RequestError, parse_body
from toolrl.gateway.protocols import GatewayProtocol
from toolrl.gateway.session import Ask, GatewaySession, Turn

TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(Body):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    # Server-side state, which the gateway does not keep: refused when set.
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None


def parse(raw: bytes) -> ResponsesRequest:
    req = parse_body(raw, ResponsesRequest)
    for name in ("previous_response_id", "conversation", "prompt"):
        if getattr(req, name) is not None:
            raise RequestError(f"{name}: the gateway keeps no conversation state; send the whole "
                               "conversation as input", param=name)
    return req


async def answer(session: GatewaySession, req: ResponsesRequest) -> dict[str, Any]:
    """A Response."""
    messages, tools = chat_messages(req), chat_tools(req.tools)
    forced = req.tool_choice.get("name") if isinstance(req.tool_choice, dict) else None
    turn = await session.turn(messages, tools, Ask(
        n=1, max_tokens=req.max_output_tokens, parse_calls=req.tool_choice != "none",
        parallel_calls=req.parallel_tool_calls is not False, tool=forced), id_prefix="resp",
        role=session.role_of(req.model))
    return response_body(req, session, turn)


# -- request ---------------------------------------------------------------------------------


def chat_messages(req: ResponsesRequest) -> list[ChatMessage]:
    """The request's instructions and input as OpenAI chat messages."""
    out: list[dict[str, Any]] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            call = {"id": _text(item, "call_id", where), "type": "function", "function": {
                "name": _text(item, "name", where), "arguments": _text(item, "arguments", where)}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last["tool_calls"] = [*(last.get("tool_calls") or []), call]
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _parts(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": _text(item, "call_id", where), "content": content})
        elif kind != "reasoning":
            raise RequestError(f"{where}.type: the items taken are message, function_call, "
                               f"function_call_output and reasoning, not {kind!r}", param=f"{where}.type")
    if not out:
        raise RequestError("input: no message to answer", param="input")
    return [ChatMessage.model_validate(m) for m in out]


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "system", "developer", "assistant"):
        raise RequestError(f"{where}.role: a message's role is user, system, developer or assistant, "
                           f"not {role!r}", param=f"{where}.role")
    text = content if isinstance(content, str) else _parts(content, f"{where}.content")
    return {"role": role, "content": text}


def _parts(parts: Any, where: str) -> str:
    """Text content parts as their text; a RequestError naming any other part."""
    if not isinstance(parts, list):
        raise RequestError(f"{where}: a string or a list of text parts", param=where)
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise RequestError(f"{where}.{j}.type: only text parts are taken ({', '.join(TEXT_PARTS)}), "
                               f"not {kind!r}", param=f"{where}.{j}.type")
        texts.append(part["text"])
    return "".join(texts)


def _text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise RequestError(f"{where}.{key}: a string is required", param=f"{where}.{key}")
    return value


def chat_tools(tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Responses function tools in the chat form (``{"type": "function", "function": {...}}``); the chat
    form itself is taken too. ``strict`` is dropped: it is the API's promise, not the model's input."""
    out = []
    for i, tool in enumerate(tools or []):
        if tool.get("type") != "function":
            raise RequestError(f"tools.{i}.type: only function tools are served, not {tool.get('type')!r}",
                               param=f"tools.{i}.type")
        if isinstance(tool.get("function"), dict):
            out.append(tool)
            continue
        if not isinstance(tool.get("name"), str):
            raise RequestError(f"tools.{i}.name: a function tool needs a name", param=f"tools.{i}.name")
        out.append({"type": "function", "function": {
            k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}})
    return out


# -- response --------------------------------------------------------------------------------


def response_body(req: ResponsesRequest, session: GatewaySession, turn: Turn) -> dict[str, Any]:
    choice = turn.choices[0]
    incomplete = choice.finish == "length"
    usage = turn.usage()
    return {
        "id": turn.id, "object": "response", "created_at": int(time.time()), "model": req.model,
        "status": "incomplete" if incomplete else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": req.instructions, "output": output_items(choice.message, incomplete),
        "parallel_tool_calls": req.parallel_tool_calls is not False, "tool_choice": req.tool_choice or "auto",
        "tools": list(req.tools or []), "max_output_tokens": req.max_output_tokens,
        # What sampled (the rollout's), not what was asked.
        "temperature": session.config.temperature, "top_p": session.config.top_p,
        "previous_response_id": None, "reasoning": None, "store": False, "truncation": "disabled",
        "text": {"format": {"type": "text"}}, "metadata": {}, "user": None,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                  "total_tokens": usage["total_tokens"],
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def output_items(message: dict[str, Any], incomplete: bool) -> list[dict[str, Any]]:
    """An assistant chat message as output items: its text as a message (also when it is empty and
    has no calls, so that every reply has an item to send back), then its calls."""
    content, calls = message.get("content") or "", message.get("tool_calls") or []
    items: list[dict[str, Any]] = []
    if content or not calls:
        part = {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
        items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
                      "status": "incomplete" if incomplete else "completed", "content": [part]})
    items += [{"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
               "name": call["function"]["name"], "arguments": call["function"]["arguments"],
               "status": "completed"} for call in calls]
    return items


async def stream(req: ResponsesRequest, body: dict[str, Any]) -> AsyncIterator[str]:
    """A Response as the server-sent events of its stream."""
    counter = itertools.count()

    def event(kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": next(counter), **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    opening = {**body, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield event("response.created", response=opening)
    yield event("response.in_progress", response=opening)
    for index, item in enumerate(body["output"]):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            yield event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            if part["text"]:
                yield event("response.output_text.delta", **at, content_index=0, delta=part["text"],
                            logprobs=[])
            yield event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
            yield event("response.content_part.done", **at, content_index=0, part=part)
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"})
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **at, name=item["name"],
                        arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event(f"response.{body['status']}", response=body)


class Responses(GatewayProtocol):
    path = "responses"
    parse, answer, stream = staticmethod(parse), staticmethod(answer), staticmethod(stream)
