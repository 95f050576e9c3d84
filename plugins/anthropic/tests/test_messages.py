"""Anthropic's Messages API on the gateway (``POST /e/{episode}/v1/messages``), called with the official
``anthropic`` client over real HTTP: content blocks become the chat messages the template renders, a
conversation sent back as a harness sends it is trained token-exact, streams and errors are
Anthropic's, and an agent program finds the endpoint where Anthropic's clients look. The engine says a
script (support.py); tokenizer, template, parser, gateway and client are real."""

from __future__ import annotations

import json

import aiohttp
import anthropic
import pytest
from support import ADD as ADD_TOOL
from support import episode, generated, hermes, tokenizer, trained
from toolrl.gateway.messages import reply_message
from toolrl.gateway.protocol import ChatMessage, RequestError, message_key, parse_body
from toolrl.schemas import ParseResult, ToolCall
from toolrl.testing import listing_imports
from toolrl_anthropic.messages import MessagesRequest, anthropic_chat_messages


def client_of(endpoint, **kwargs):
    base = endpoint.base_url.removesuffix("/v1")
    return anthropic.AsyncAnthropic(base_url=base, **{"api_key": endpoint.api_key, **kwargs}, max_retries=0)


def resend(block):
    """A content block as a harness sends it back: text stripped, a call's input in another key order."""
    if block.type == "text":
        return {"type": "text", "text": block.text.strip()}
    return {"type": "tool_use", "id": block.id, "name": block.name, "input": dict(reversed(block.input.items()))}


async def test_a_tool_conversation_sent_back_as_a_harness_does_trains_the_sampled_tokens_in_one_piece():
    script = ["Let me add.\n" + hermes("add", {"a": 2, "b": 3}), hermes("add", {"a": 5, "b": 9}),
              "The answer is 14."]
    replies = []

    async def program(task, endpoint):
        client = client_of(endpoint)
        system = [{"type": "text", "text": "You add numbers.", "cache_control": {"type": "ephemeral"}}]
        messages = list(task["prompt"])
        while True:
            reply = await client.messages.create(model=endpoint.model, max_tokens=256, system=system,
                                                 messages=messages, tools=[ADD_TOOL], metadata={"user_id": "u"})
            replies.append(reply)
            messages.append({"role": "assistant", "content": [resend(b) for b in reply.content]})
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses:
                break
            sums = [str(u.input["a"] + u.input["b"]) for u in uses]
            messages.append({"role": "user", "content": [  # a result as a string, then as text blocks
                {"type": "tool_result", "tool_use_id": u.id,
                 "content": s if len(replies) == 1 else [{"type": "text", "text": s}]} for u, s in zip(uses, sums)]})
        await client.close()
        return float("14" in replies[-1].content[0].text)

    engine, outcome = await episode(script, program)
    pieces = outcome.pieces
    first, second, last = replies
    assert [b.type for b in first.content] == ["text", "tool_use"] and first.content[0].text.strip() == "Let me add."
    assert (first.content[1].name, first.content[1].input, first.stop_reason) == ("add", {"a": 2, "b": 3}, "tool_use")
    assert [b.type for b in second.content] == ["tool_use"] and second.content[0].input == {"a": 5, "b": 9}
    assert last.stop_reason == "end_turn" and last.content[0].text == "The answer is 14." and last.id.startswith("msg")
    assert [r.usage.output_tokens for r in replies] == [len(ids) for ids in generated(engine)]
    traj = pieces[-1]
    assert traj.error is None and traj.termination == "answered", traj.error
    assert len(pieces) == 1 and traj.turns == 3 and outcome.terms == {"agent": 1.0}
    assert trained(pieces) == [t for ids in generated(engine) for t in ids]
    masked = tokenizer().decode([t for t, m in zip(traj.response_ids, traj.response_mask) if not m])
    assert "<tool_response>\n5\n</tool_response>" in masked and "<tool_response>\n14\n</tool_response>" in masked
    live = traj.prompt_ids + traj.response_ids
    assert all(live[:len(call.prompt_ids)] == call.prompt_ids for call in engine.calls)


async def test_streaming_gives_anthropics_events_and_the_final_message():
    seen = {}

    async def program(task, endpoint):
        client = client_of(endpoint)
        async with client.messages.stream(model=endpoint.model, max_tokens=256, messages=task["prompt"],
                                          tools=[ADD_TOOL]) as stream:
            events = [event async for event in stream]
            seen["final"] = await stream.get_final_message()
        seen["text"] = "".join(e.text for e in events if e.type == "text")
        seen["json"] = "".join(e.partial_json for e in events if e.type == "input_json")
        seen["types"] = [e.type for e in events if e.type.startswith("message") or e.type.startswith("content")]
        await client.close()
        return 1.0

    engine, outcome = await episode(["Adding.\n" + hermes("add", {"a": 2, "b": 3})], program)
    final = seen["final"]
    assert outcome.pieces[-1].error is None, outcome.pieces[-1].error
    assert [b.type for b in final.content] == ["text", "tool_use"] and final.stop_reason == "tool_use"
    assert final.content[0].text == seen["text"] and seen["text"].strip() == "Adding."
    assert (final.content[1].name, final.content[1].input, json.loads(seen["json"])) == ("add", {"a": 2, "b": 3},
                                                                                          {"a": 2, "b": 3})
    assert final.id.startswith("msg") and final.usage.output_tokens == len(generated(engine)[0])
    assert seen["types"] == ["message_start", *["content_block_start", "content_block_delta",
                                                "content_block_stop"] * 2, "message_delta", "message_stop"]


async def refusal(call):
    """A refused call's status, error type and message, as the client read them."""
    try:
        await call
    except anthropic.APIStatusError as exc:
        return exc.status_code, exc.body["error"]["type"], exc.body["error"]["message"]
    return 200, "", ""


async def test_bad_requests_get_anthropics_errors_and_the_episode_goes_on():
    seen = {}

    async def program(task, endpoint):
        client, body = client_of(endpoint), {"model": endpoint.model, "messages": task["prompt"]}
        wrong = client_of(endpoint, api_key="nope")
        seen["key"] = await refusal(wrong.messages.create(max_tokens=16, **body))
        seen["model"] = await refusal(client.messages.create(max_tokens=16, **{**body, "model": "claude-9"}))
        seen["max_tokens"] = await refusal(client.post("/v1/messages", cast_to=object, body=body))
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        seen["image"] = await refusal(client.messages.create(max_tokens=16, model=endpoint.model, messages=[
            {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}]))
        bearer = client_of(endpoint, api_key=None, auth_token=endpoint.api_key)  # Authorization: Bearer
        seen["ok"] = (await bearer.messages.create(max_tokens=16, **body)).content[0].text
        for each in (client, wrong, bearer):
            await each.close()
        return 1.0

    _, outcome = await episode(["fine"], program)
    pieces = outcome.pieces
    assert seen["key"][:2] == (401, "authentication_error")
    assert seen["model"][:2] == (404, "not_found_error") and "claude-9" in seen["model"][2]
    assert seen["max_tokens"][:2] == (400, "invalid_request_error") and "max_tokens" in seen["max_tokens"][2]
    assert seen["image"][:2] == (400, "invalid_request_error") and "messages.0.content.0.type" in seen["image"][2]
    assert seen["ok"] == "fine" and pieces[-1].termination == "answered" and pieces[-1].turns == 1


async def test_stop_sequences_max_tokens_and_tool_choice_none_give_their_stop_reasons():
    replies = []

    async def program(task, endpoint):
        client, body = client_of(endpoint), {"model": endpoint.model, "messages": task["prompt"]}
        replies.append(await client.messages.create(max_tokens=64, stop_sequences=["END", "DONE"], **body))
        replies.append(await client.messages.create(max_tokens=3, **body))
        replies.append(await client.messages.create(max_tokens=64, tools=[ADD_TOOL], tool_choice={"type": "none"},
                                                    **body))
        await client.close()
        return 1.0

    call = hermes("add", {"a": 2, "b": 3})
    _, outcome = await episode(["The answer is 14.\nDONE", "word " * 10, call], program)
    stopped, cut, plain = replies
    assert outcome.pieces[-1].error is None, outcome.pieces[-1].error
    assert (stopped.stop_reason, stopped.stop_sequence, stopped.content[0].text) == ("stop_sequence", "DONE",
                                                                                     "The answer is 14.\n")
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3 and cut.stop_sequence is None
    assert plain.stop_reason == "end_turn" and [b.type for b in plain.content] == ["text"]
    assert plain.content[0].text == call


def test_content_blocks_become_chat_messages_and_a_sent_back_reply_keeps_its_key():
    req = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 1024}, "top_k": 5,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Add."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "Adding."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"b": 3, "a": 2}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                 "content": [{"type": "text", "text": "no such tool"}]},
                {"type": "text", "text": "Go on."}]}]})
    messages = anthropic_chat_messages(req)
    assert [m.model_dump(exclude_none=True) for m in messages] == [
        {"role": "system", "content": "Be brief.\n\nAdd."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "Adding.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": '{"b": 3, "a": 2}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "5"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such tool"},
        {"role": "user", "content": "Go on."}]
    served = reply_message("Adding.\n", ParseResult(content="Adding.\n", calls=[
        ToolCall(name="add", arguments={"a": 2, "b": 3}, id="call_x")]))
    assert message_key(messages[2]) == message_key(ChatMessage.model_validate(served))


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(("messages", "extra", "param"), [
    ([{"role": "user", "content": [{"type": "document", "source": {}}]}], {}, "messages.0.content.0.type"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {}}]}]}], {}, "messages.0.content.0.content.0.type"),
    ([USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "add"}]}], {},
     "messages.1.content.0.input"),
    ([USER, {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "add", "input": {}}]}], {},
     "messages.1.content.0.type"),
    ([{"role": "system", "content": "x"}], {}, "messages.0.role"),
    ([USER], {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ([USER], {"tool_choice": {"type": "required"}}, "tool_choice.type"),
])
def test_a_bad_body_is_a_400_naming_its_field(messages, extra, param):
    raw = json.dumps({"model": "m", "max_tokens": 8, "messages": messages, **extra}).encode()
    with pytest.raises(RequestError) as refused:
        anthropic_chat_messages(parse_body(raw, MessagesRequest))
    assert refused.value.status == 400 and refused.value.param == param and param in str(refused.value)


async def post(url, body, key):
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers={"x-api-key": key}) as answer:
        return answer.status, await answer.json(content_type=None)


async def test_a_tool_choice_naming_no_tool_and_an_unknown_model_are_anthropics_errors():
    answers = {}

    async def program(task, endpoint):
        body = {"model": endpoint.model, "max_tokens": 16, "messages": [{"role": "user", "content": "2+3?"}]}
        url, key = f"{endpoint.base_url}/messages", endpoint.api_key
        answers["choice"] = await post(url, {**body, "tools": [ADD_TOOL], "tool_choice": {"type": "tool", "name": "mul"}},
                                       key)
        answers["model"] = await post(url, {**body, "model": "claude"}, key)
        answers["role"] = await post(url, {**body, "model": "executor"}, key)
        return 1.0

    await episode(["fine"], program, roles=("planner", "executor"))
    assert answers["choice"] == (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": "tool_choice: no function 'mul' in tools"}})
    status, body = answers["model"]
    assert status == 404 and body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert "'planner', 'executor'" in body["error"]["message"]
    assert answers["role"][0] == 200 and answers["role"][1]["model"] == "executor"


async def test_a_program_finds_the_endpoint_where_anthropics_client_looks(monkeypatch):
    """ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY, as a program of its own gets them: a client made from
    the environment alone (no arguments) answers; the OpenAI variables are there as before."""
    seen = {}

    async def program(task, endpoint):
        env = seen["env"] = endpoint.environ()
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        client = anthropic.AsyncAnthropic(max_retries=0)
        reply = await client.messages.create(model=env["TOOLRL_MODEL"], max_tokens=16, messages=task["prompt"])
        seen["text"] = reply.content[0].text
        await client.close()
        return 1.0

    _, outcome = await episode(["14"], program)
    env = seen["env"]
    assert seen["text"] == "14" and outcome.pieces[-1].termination == "answered"
    assert env["ANTHROPIC_BASE_URL"] + "/v1" == env["OPENAI_BASE_URL"]
    assert env["ANTHROPIC_API_KEY"] == env["OPENAI_API_KEY"]


def test_listing_the_plugins_imports_its_entry_point_alone():
    """Every toolrl process lists the plugins: this one's costs its ``__init__`` (no pydantic models, no
    aiohttp); the protocol loads where a gateway starts."""
    printed, modules = listing_imports("toolrl_anthropic", "aiohttp")
    assert "anthropic" in printed.split() and modules == ["toolrl_anthropic"]
