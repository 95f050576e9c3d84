"""``toolrl serve --token-history``: a chat conversation continues from the exact tokens served,
even where the chat template would re-render an earlier turn differently (here: the model's
compact tool-call JSON, which the template re-renders with spaces). Driven in-process through the
service the HTTP routes call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import ANSWER, CALL, SCRIPTED_ENGINE
from toolrl.gateway.protocol import ChatRequest
from toolrl.plugins import get_plugins
from toolrl_openai.conversations import RECORD_FILE, Conversations
from toolrl_openai.service import Service

COMPACT_CALL = '<tool_call>\n{"name":"calculator","arguments":{"expression":"2+3"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]
QUESTION = [{"role": "user", "content": "What is 2+3?"}]


def _service(tokenizer: Any, record: Path, token_history: bool) -> Service:
    namespace: dict[str, Any] = {}
    exec(SCRIPTED_ENGINE, namespace)  # the same scripted model the served tests install as a plugin
    engine = namespace["ChatScript"](tokenizer, [COMPACT_CALL, ANSWER])
    parser = get_plugins().load_part("tool_parsers", "hermes")()
    return Service(engine, tokenizer, parser, "tiny-qwen3", Conversations(tokenizer, record),
                   token_history=token_history)


async def _talk(service: Service) -> None:
    first = await service.chat(ChatRequest(model="tiny-qwen3", messages=QUESTION, tools=TOOLS))
    reply = first["choices"][0]["message"]
    assert [c["function"]["name"] for c in reply["tool_calls"]] == ["calculator"]
    tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "5"}
    second = await service.chat(ChatRequest(model="tiny-qwen3", messages=[*QUESTION, reply, tool], tools=TOOLS))
    assert second["choices"][0]["message"]["content"] == ANSWER
    service.conversations.close_all()


@pytest.mark.parametrize("token_history", [False, True])
async def test_token_history(tokenizer: Any, tmp_path: Path, token_history: bool) -> None:
    await _talk(_service(tokenizer, tmp_path, token_history))
    rows = [json.loads(line) for line in (tmp_path / RECORD_FILE).read_text().splitlines()]
    if not token_history:
        # The template re-renders the call with spaces: the second request's prompt does not
        # extend what the model produced, so it starts a trajectory of its own.
        assert [r["turns"] for r in rows] == [1, 1]
        return
    (row,) = rows
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    mask, resp = row["response_mask"], row["response_ids"]
    assert row["turns"] == 2
    assert [t for t, m in zip(resp, mask) if m] == tokenizer.encode(COMPACT_CALL, add_special_tokens=False) + \
        [eos] + tokenizer.encode(ANSWER, add_special_tokens=False) + [eos]
    # Everything else is the template's: the conversation as rendered, but with the call exactly
    # as the model wrote it.
    full = [*QUESTION, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}]},
        {"role": "tool", "name": "calculator", "content": "5"}, {"role": "assistant", "content": ANSWER}]
    rendered = tokenizer.apply_chat_template(full, tools=TOOLS, tokenize=False)
    assert CALL in rendered
    text = tokenizer.decode(row["prompt_ids"] + resp, skip_special_tokens=False)
    assert text + "\n" == rendered.replace(CALL, COMPACT_CALL)
