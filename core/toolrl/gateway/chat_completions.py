"""``POST /v1/chat/completions``: one model call (:meth:`GatewaySession.turn`) answered as the OpenAI API does
(``tools``, ``tool_choice``, ``parallel_tool_calls``, ``n``, ``stream``, ``logprobs``). Like every gateway
protocol (``responses``, a plugin's): ``parse`` the body, ``answer`` it, ``stream`` the answer."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from toolrl.gateway.messages import chat_chunks
from toolrl.gateway.protocol import ChatRequest, RequestError, parse_body
from toolrl.gateway.protocols import GatewayProtocol
from toolrl.gateway.session import Ask, GatewaySession


def parse(raw: bytes) -> ChatRequest:
    req = parse_body(raw, ChatRequest)
    if req.top_logprobs:
        raise RequestError("the gateway returns the sampled token's logprob only: use top_logprobs=0",
                           param="top_logprobs")
    return req


async def answer(session: GatewaySession, req: ChatRequest) -> dict[str, Any]:
    """A chat completion."""
    max_tokens = next((v for v in (req.max_completion_tokens, req.max_tokens) if v is not None), None)
    forced = (req.tool_choice.get("function") or {}).get("name") if isinstance(req.tool_choice, dict) else None
    turn = await session.turn(req.messages, req.tools, Ask(
        n=req.n, max_tokens=max_tokens, stop=req.stop_strings(), parse_calls=req.tool_choice != "none",
        parallel_calls=req.parallel_tool_calls is not False, tool=forced),
        role=session.role_of(req.model))
    choices = []
    for i, c in enumerate(turn.choices):
        choice: dict[str, Any] = {"index": i, "message": c.message, "finish_reason": c.finish, "logprobs": None}
        if req.logprobs:
            choice["logprobs"] = {"content": [
                {"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}
                for piece, lp in zip((turn.decode([t]) for t in c.generation.token_ids), c.generation.logprobs)]}
        choices.append(choice)
    return {"id": turn.id, "object": "chat.completion", "created": int(time.time()), "model": req.model,
            "choices": choices, "usage": turn.usage()}


def stream(req: ChatRequest, body: dict[str, Any]) -> AsyncIterator[str]:
    """The completion as its stream's chunks (each choice's content in one)."""
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    return chat_chunks(body, [[c["message"]["content"] or ""] for c in body["choices"]], include_usage)


class ChatCompletions(GatewayProtocol):
    path = "chat/completions"
    parse, answer, stream = staticmethod(parse), staticmethod(answer), staticmethod(stream)
