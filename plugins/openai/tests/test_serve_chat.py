"""``toolrl serve`` with a scripted model, driven by the official ``openai`` client: tool calls
parsed and returned in OpenAI's shape, tool messages accepted, streaming, usage, errors, and the
recorded trajectories checked against the chat template's rendering of each conversation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from support import ANSWER, CALL, ServeProcess, recorded

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]
QUESTION = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture
def client(scripted_server: ServeProcess) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=scripted_server.url, api_key="EMPTY", max_retries=0)
    yield c
    c.close()


def _assistant(message: Any) -> dict[str, Any]:
    """The assistant message as a client sends it back."""
    return message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})


def _conversation(client: openai.OpenAI) -> tuple[list[dict[str, Any]], Any, Any]:
    first = client.chat.completions.create(model="tiny-qwen3", messages=QUESTION, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    messages = [*QUESTION, _assistant(first.choices[0].message),
                {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    second = client.chat.completions.create(model="tiny-qwen3", messages=messages, tools=TOOLS)
    return messages, first, second


def test_tool_calls_and_tool_messages(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny-qwen3"]
    messages, first, second = _conversation(client)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "2+3"}
    assert first.usage.completion_tokens == first.usage.total_tokens - first.usage.prompt_tokens > 0

    # The tool message was rendered by the template: the prompt grew by exactly this turn's tokens.
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].message.tool_calls is None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens


def test_streaming(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="tiny-qwen3", messages=QUESTION, tools=TOOLS,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls = [c for ch in chunks if ch.choices for c in ch.choices[0].delta.tool_calls or []]
    assert len(calls) == 1 and calls[0].function.name == "calculator" and calls[0].id.startswith("call_")
    assert json.loads(calls[0].function.arguments) == {"expression": "2+3"}
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0

    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump(
        include={"id", "type", "function"})]}, {"role": "tool", "tool_call_id": calls[0].id, "content": "5"}]
    stream = client.chat.completions.create(model="tiny-qwen3", messages=messages, tools=TOOLS, stream=True)
    pieces = [ch.choices[0].delta.content for ch in stream if ch.choices and ch.choices[0].delta.content]
    assert len(pieces) > 3  # token by token
    assert "".join(pieces) == ANSWER


def test_choices_logprobs_and_tool_choice_none(client: openai.OpenAI, tokenizer: Any) -> None:
    out = client.chat.completions.create(model="tiny-qwen3", messages=QUESTION, tools=TOOLS, n=2, logprobs=True,
                                         extra_body={"return_tokens_as_token_ids": True})
    assert [c.index for c in out.choices] == [0, 1]
    ids = {c.message.tool_calls[0].id for c in out.choices}
    assert len(ids) == 2  # every call has its own id
    expect = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    for choice in out.choices:
        assert [int(t.token.removeprefix("token_id:")) for t in choice.logprobs.content] == expect
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx([-0.25 - 0.01 * i for i in
                                                                               range(len(expect))])
    plain = client.chat.completions.create(model="tiny-qwen3", messages=QUESTION, tools=TOOLS, tool_choice="none")
    assert plain.choices[0].message.content == CALL and plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason == "stop"


def test_streamed_completion(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="tiny-qwen3", prompt="2+3=", max_tokens=64, stream=True,
                                            stream_options={"include_usage": True}))
    # A raw prompt has no assistant turn: the script's turn index is -1, its last entry.
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ANSWER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.prompt_tokens > 0


def test_errors_are_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny-qwen3", messages=[])
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model="tiny-qwen3", messages=QUESTION, tools=TOOLS, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="logprobs=0"):
        client.completions.create(model="tiny-qwen3", prompt="2+3=", logprobs=2)


def test_completions_with_token_ids(client: openai.OpenAI, tokenizer: Any) -> None:
    prompt = tokenizer.encode("2+3=", add_special_tokens=False)
    out = client.completions.create(model="tiny-qwen3", prompt=prompt, max_tokens=8, logprobs=0,
                                    extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True})
    lp = out.choices[0].logprobs
    ids = [int(t.removeprefix("token_id:")) for t in lp.tokens]
    assert out.choices[0].token_ids == ids and out.choices[0].prompt_token_ids == prompt
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")  # the script's turn end, kept
    assert out.choices[0].text == tokenizer.decode(ids[:-1])
    assert lp.token_logprobs == pytest.approx([-0.25 - 0.01 * i for i in range(len(ids))])
    assert out.usage.prompt_tokens == len(prompt)


def test_recorded_conversations_match_the_template(client: openai.OpenAI, scripted_server: ServeProcess,
                                                   tokenizer: Any) -> None:
    messages, first, second = _conversation(client)
    full = [*messages, {"role": "assistant", "content": ANSWER}]
    # The template wants arguments as objects; the client sent OpenAI's JSON strings.
    full[1] = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}]}
    full[2] = {"role": "tool", "name": "calculator", "content": "5"}
    rendered = tokenizer.apply_chat_template(full, tools=TOOLS, tokenize=False)
    prompt = tokenizer.apply_chat_template(QUESTION, tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # One trajectory per conversation (this test's; also test_tool_calls_and_tool_messages' and
    # test_streaming's when they ran), written once idle.
    conversations = recorded(scripted_server, 1, lambda r: r["prompt_ids"] == list(prompt) and r["turns"] == 2)
    assert conversations
    for row in conversations:
        ids = row["prompt_ids"] + row["response_ids"]
        assert row["prompt_text"] + row["response_text"] == tokenizer.decode(ids, skip_special_tokens=False)
        # Everything the model saw is the template's rendering (which adds a "\n" after the last turn).
        assert rendered == tokenizer.decode(ids, skip_special_tokens=False) + "\n"
        assert ids == tokenizer.encode(rendered, add_special_tokens=False)[:-1]
        mask, resp = row["response_mask"], row["response_ids"]
        model = [t for t, m in zip(resp, mask) if m]
        assert model == tokenizer.encode(CALL, add_special_tokens=False) + [eos] + \
            tokenizer.encode(ANSWER, add_special_tokens=False) + [eos]
        assert [lp for lp, m in zip(row["logprobs"], mask) if m] == pytest.approx(
            [-0.25 - 0.01 * i for i in range(len(tokenizer.encode(CALL, add_special_tokens=False)) + 1)]
            + [-0.25 - 0.01 * i for i in range(len(tokenizer.encode(ANSWER, add_special_tokens=False)) + 1)])
        assert all(lp == 0.0 for lp, m in zip(row["logprobs"], mask) if not m)
        assert row["final_response"] == ANSWER and row["termination"] == "answered"
        # The template's tokens between the turns (the tool message, generation prompt) are mask 0.
        between = tokenizer.decode([t for t, m in zip(resp, mask) if not m], skip_special_tokens=False)
        assert "<tool_response>\n5\n</tool_response>" in between
