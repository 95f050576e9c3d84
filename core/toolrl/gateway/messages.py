"""OpenAI chat messages to and from what the chat template and the tool parser take: a request's
tools as schemas, its messages as template messages, a generated turn as the assistant message a
client gets, and a chat completion as the chunks of its stream. Shared by the gateway and
``toolrl serve``."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from toolrl.gateway.protocol import ChatMessage, RequestError, sse, validated
from toolrl.images import ImageError, ImageLimits, is_image_part, part_image, prepare
from toolrl.renderers.chat import ChatRenderer
from toolrl.schemas import ParseResult, ToolSchema


def model_list(names: str | Sequence[str], created: int = 0) -> dict[str, Any]:
    """``GET /v1/models``: the model served as ``names`` (one name, or several: a run's roles)."""
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "toolrl"}
                                       for name in ([names] if isinstance(names, str) else names)]}


def finish_reason(finish: str, message: dict[str, Any] | None = None) -> str:
    """The OpenAI ``finish_reason`` of an engine's ``finish`` (a stop string is a stop), ``tool_calls``
    where the reply ``message`` holds calls."""
    if message is not None and message.get("tool_calls"):
        return "tool_calls"
    return "stop" if finish == "stop_string" else finish


def tool_schemas(tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A request's ``tools`` as function schemas; a RequestError naming the first bad one."""
    return [validated(ToolSchema, tool, f"tools.{i}").model_dump(exclude_none=True) for i, tool in enumerate(tools or [])]


def message_text(message: ChatMessage, index: int, images: list[bytes], processor: Any = None,
                 image_limits: ImageLimits | None = None) -> tuple[str, int]:
    """A message's text and how many images it shows (their PNG appended to ``images``, within
    ``image_limits``); text and image parts (``image_url`` data URLs, base64). Images need a
    vision-language model's ``processor``."""
    content = message.content
    if content is None or isinstance(content, str):
        return content or "", 0
    parts, shown = [], 0
    for j, part in enumerate(content):
        where = f"messages.{index}.content.{j}"
        if is_image_part(part) and processor is None:
            raise RequestError(f"{where}: this model takes no images (it is not a vision-language model)",
                               param="messages")
        if is_image_part(part):
            try:
                images.append(prepare(part_image(part), image_limits or ImageLimits()))
            except ImageError as exc:
                raise RequestError(f"{where}: {exc}", param="messages") from None
            shown += 1
        elif part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        else:
            raise RequestError(f"{where}: only text and image parts are supported, got {part.get('type')!r}",
                               param="messages")
    if shown and len(parts) > 1:
        raise RequestError(f"messages.{index}.content: images with several text parts are not supported "
                           "(one text part, after the images)", param="messages")
    return "".join(parts), shown


def template_messages(messages: Sequence[ChatMessage], renderer: ChatRenderer, images: list[bytes],
                      processor: Any = None, image_limits: ImageLimits | None = None) -> list[dict[str, Any]]:
    """``messages`` as the template takes them (tool results as ``renderer`` writes them); their images'
    PNG go to ``images``, in order."""
    names: dict[str, str] = {}  # tool_call id -> function name, for tool messages
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        text, shown = message_text(m, i, images, processor, image_limits)
        role = "system" if m.role == "developer" else m.role
        if shown and m.role == "assistant":
            raise RequestError(f"messages.{i}.content: an assistant message cannot hold images", param="messages")
        if shown and m.role != "tool":
            out.append({"role": role, "content": [{"type": "image"}] * shown + [{"type": "text", "text": text}]})
        elif m.role == "tool":
            name = m.name or names.get(m.tool_call_id or "", "tool")
            out.append(renderer.tool_message(text, name, shown, call_id=m.tool_call_id))
        elif m.role == "assistant" and m.tool_calls:
            calls = []
            for call in m.tool_calls:
                if call.id:
                    names[call.id] = call.function.name
                try:
                    arguments: Any = json.loads(call.function.arguments or "{}")
                except json.JSONDecodeError:
                    arguments = call.function.arguments
                calls.append({"type": "function", **({"id": call.id} if call.id else {}),
                              "function": {"name": call.function.name, "arguments": arguments}})
            out.append({"role": "assistant", "content": text, "tool_calls": calls})
        else:
            out.append({"role": role, "content": text})
    return out


def reply_message(text: str, parsed: ParseResult | None) -> dict[str, Any]:
    """A generated turn as the assistant message a client gets: its calls (``parsed``; None: calls are
    not parsed) as ``tool_calls``, with their ids where the format has them. Malformed calls stay
    visible: the client gets the model's text as it was."""
    if parsed is None:
        return {"role": "assistant", "content": text}
    if not parsed.calls:
        return {"role": "assistant", "content": text if parsed.errors else parsed.content}
    calls = [{"id": c.id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
              "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
             for c in parsed.calls]
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}


async def chat_chunks(body: dict[str, Any], pieces: Sequence[Sequence[str]],
                      include_usage: bool = False) -> AsyncIterator[str]:
    """A chat completion ``body`` as its stream's events: per choice its role, its content in
    ``pieces`` (the whole content when they do not join to it), its calls, its finish."""
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        return sse({**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                         "finish_reason": finish}]})

    for choice, parts in zip(body["choices"], pieces):
        i, message = choice["index"], choice["message"]
        yield chunk(i, {"role": "assistant", "content": ""})
        content = message["content"] or ""
        for piece in parts if "".join(parts) == content else [content]:
            if piece:
                yield chunk(i, {"content": piece})
        for k, call in enumerate(message.get("tool_calls") or []):
            yield chunk(i, {"tool_calls": [{"index": k, **call}]})
        yield chunk(i, {}, choice["finish_reason"], choice["logprobs"])
    if include_usage:
        yield sse({**head, "choices": [], "usage": body["usage"]})
    yield "data: [DONE]\n\n"
