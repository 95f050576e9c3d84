"""The gateway's Responses API (``POST /v1/responses``): the official ``openai`` client's
``responses.create`` and the OpenAI Agents SDK, unmodified, over real HTTP. What is trained is what the
engine sampled, in one piece, whatever form the program sends its output items back in.
"""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest
from gateway_kit import ADD, SAMPLE, episode, hermes, trained

ADD_TOOL = {"type": "function", **ADD["function"]}  # the Responses form: no "function" wrapper
SCRIPT = [hermes("add", {"a": 2, "b": 3}), hermes("add", {"a": 5, "b": 9}), "The answer is 14"]
TASK = SAMPLE.prompt[0].content


def context_text(tok, traj):
    """The tokens of the trajectory the model did not write (tool results...), decoded."""
    return tok.decode([t for t, m in zip(traj.response_ids, traj.response_mask) if not m])


def resent(item):
    """An output item sent back as an input item, its call's arguments re-serialised (other key order
    and spacing)."""
    data = item.model_dump(exclude_none=True)
    if data["type"] == "function_call":
        data["arguments"] = json.dumps(dict(reversed(json.loads(data["arguments"]).items())), indent=2)
    return data


async def test_a_tool_conversation_through_responses_trains_the_sampled_tokens_in_one_piece():
    responses = []

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        items = [{"role": "user", "content": task["prompt"][0]["content"]}]
        while True:
            response = await client.responses.create(model=endpoint.model, instructions="Add with the tool.",
                                                      input=items, tools=[ADD_TOOL], store=False, include=[])
            responses.append(response)
            items += [resent(item) for item in response.output]  # as the Agents SDK does
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                break
            for call in calls:
                args = json.loads(call.arguments)
                result = str(args["a"] + args["b"])
                items.append({"type": "function_call_output", "call_id": call.call_id, "output": result})
        await client.close()
        return float(response.output_text == "The answer is 14")

    # The first reply is text and a call: a message item and a function_call item, one assistant
    # message again when sent back.
    tok, ctx, pieces = await episode(["Adding 2 and 3 first.\n" + SCRIPT[0], *SCRIPT[1:]], program)
    traj = pieces[-1]
    assert traj.error is None and traj.termination == "answered" and traj.reward == 1.0
    assert [r.status for r in responses] == ["completed"] * 3
    assert all(r.id.startswith("resp") for r in responses)
    message, call = responses[0].output
    assert message.type == "message" and message.content[0].text == "Adding 2 and 3 first."
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "add", {"a": 2, "b": 3})
    assert call.call_id and call.id.startswith("fc_") and responses[0].usage.output_tokens > 0
    assert [i.type for i in responses[1].output] == ["function_call"]
    last = responses[-1].output
    assert [i.type for i in last] == ["message"] and last[0].role == "assistant"
    assert len(pieces) == 1 and traj.turns == 3
    assert trained(pieces) == [t for ids in ctx.engine.generated for t in ids]
    assert "Add with the tool." in tok.decode(traj.prompt_ids)
    assert all(f"<tool_response>\n{n}\n</tool_response>" in context_text(tok, traj) for n in (5, 14))


async def test_streaming_gives_the_responses_events_and_the_calls_come_through():
    from openai.types.responses import ResponseCompletedEvent, ResponseFunctionToolCall

    seen = []

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        items = [{"role": "user", "content": task["prompt"][0]["content"]}]
        for _ in range(2):
            stream = await client.responses.create(model=endpoint.model, input=items, tools=[ADD_TOOL],
                                                    stream=True)
            events = [e async for e in stream]
            seen.append(events)
            final = events[-1].response
            items += [resent(item) for item in final.output]
            items += [{"type": "function_call_output", "call_id": i.call_id, "output": "5"}
                      for i in final.output if i.type == "function_call"]
        await client.close()
        return 1.0

    _, ctx, pieces = await episode([SCRIPT[0], "Fourteen."], program)
    call, text = seen
    assert [e.type for e in call] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e.type for e in text] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert all([e.sequence_number for e in events] == list(range(len(events))) for events in seen)
    assert isinstance(call[-1], ResponseCompletedEvent) and call[-1].response.status == "completed"
    done = call[-2].item
    assert isinstance(done, ResponseFunctionToolCall)
    assert (done.name, json.loads(done.arguments)) == ("add", {"a": 2, "b": 3})
    assert call[4].arguments == done.arguments and call[2].item.id == done.id
    assert text[4].delta == "Fourteen." and text[-1].response.output_text == "Fourteen."
    assert len(pieces) == 1 and trained(pieces) == [t for ids in ctx.engine.generated for t in ids]


async def test_a_reply_cut_at_max_output_tokens_is_incomplete():
    seen = []

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        seen.append(await client.responses.create(model=endpoint.model, input=TASK, max_output_tokens=4))
        stream = await client.responses.create(model=endpoint.model, input="again", max_output_tokens=4,
                                                stream=True)
        seen.append([e async for e in stream][-1])
        await client.close()
        return 0.0

    _, ctx, pieces = await episode(["word " * 30], program)
    response, last = seen
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 4 and response.output[0].status == "incomplete"
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert pieces[-1].termination == "length"


async def test_bad_requests_are_400s_naming_the_field_and_the_episode_goes_on():
    errors = {}
    user = {"role": "user", "content": TASK}

    async def program(task, endpoint):
        url, headers = f"{endpoint.base_url}/responses", {"Authorization": f"Bearer {endpoint.api_key}"}
        body = {"model": endpoint.model, "input": [user]}
        bad = {
            "item": {**body, "input": [user, {"type": "web_search_call", "id": "ws_1"}]},
            "previous": {**body, "previous_response_id": "resp_1"},
            "tool": {**body, "tools": [ADD_TOOL, {"type": "web_search"}]},
            "image": {**body, "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "what is this?"},
                {"type": "input_image", "image_url": "data:,"}]}]},
            "role": {**body, "input": [{"type": "message", "role": "tool", "content": "5"}]},
            "call": {**body, "input": [user, {"type": "function_call", "call_id": "c1", "arguments": "{}"}]},
            "type": {**body, "max_output_tokens": "lots"},
            "model": {**body, "model": "gpt-9"},
        }
        async with aiohttp.ClientSession(headers=headers) as http:
            for name, request in bad.items():
                async with http.post(url, json=request) as reply:
                    errors[name] = (reply.status, (await reply.json())["error"]["param"])
            async with http.post(url, json=body) as reply:
                ok = reply.status, await reply.json()
        client = endpoint.client(max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model=endpoint.model, input=TASK, previous_response_id="resp_1")
        await client.close()
        errors["client"] = refused.value.param, "previous_response_id" in refused.value.message
        return float(ok[0] == 200 and ok[1]["output"][0]["content"][0]["text"] == "fine")

    _, _, pieces = await episode(["fine"], program)
    assert errors == {"item": (400, "input.1.type"), "previous": (400, "previous_response_id"),
                      "tool": (400, "tools.1.type"), "image": (400, "input.0.content.1.type"),
                      "role": (400, "input.0.role"), "call": (400, "input.1.name"),
                      "type": (400, "max_output_tokens"), "model": (404, "model"),
                      "client": ("previous_response_id", True)}
    assert pieces[-1].reward == 1.0 and pieces[-1].turns == 1
