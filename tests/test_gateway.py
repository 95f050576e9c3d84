"""The gateway: agent programs' calls, made with the official ``openai`` client over real HTTP, become
trajectories whose trained tokens are the tokens the engine sampled, whatever the program sends back.

The engine stands in for a model (it says the next text of a script: no GPU, no weights needed to
show what is recorded); the tokenizers, the families' chat templates and parsers, the gateway and
the client are real.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import textwrap
import threading
from pathlib import Path

import aiohttp
import pytest
from _dists import load_plugin
from family_tokenizers import family_tokenizer
from gateway_kit import ADD, SAMPLE, Program, ScriptEngine, context, episode, hermes, post, trained
from toolrl.config import RolloutConfig
from toolrl.engines import Generation, SamplingParams
from toolrl.gateway.chat_completions import ChatCompletions
from toolrl.gateway.messages import template_messages
from toolrl.gateway.protocol import ChatMessage, RequestError, message_key
from toolrl.gateway.record import EpisodeRecord
from toolrl.gateway.responses import Responses
from toolrl.gateway.server import Gateway
from toolrl.gateway.session import Ask, GatewaySession
from toolrl.plugins.parts import BuildContext, build_part
from toolrl.rollout import run_rollouts
from toolrl.testing import parser_corpus as pc
from toolrl.testing.scripted_engine import scripted_generation

ROOT = Path(__file__).resolve().parents[1]

# Each family's call as its models write it, and reasoning it writes before (which clients drop).
CALLS = {"qwen2_5": hermes, "qwen3": hermes, "gemma3": hermes, "qwen3_5": pc.qwen3_coder,
         "llama3": pc.llama3_json, "deepseek_v3": lambda n, a: pc.deepseek_v3((n, a)), "glm45": pc.glm45,
         "gemma": pc.gemma, "gpt_oss": pc.gpt_oss}
THINK = {"qwen3": "<think>\nadding\n</think>\n\n"}


def contains(seq, part):
    return any(seq[i:i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def appends_tool_results(renderer):
    try:
        renderer.tool_delta([renderer.tool_message("5", "add", call_id="call_0")])
    except Exception:
        return False
    return True


def resend(message, ids):
    """An assistant message as a client sends it back re-serialised: reasoning dropped, text stripped,
    call ids renamed, arguments in another key order and spacing."""
    content = re.sub(r"<think>.*?</think>", "", message.content or "", flags=re.DOTALL).strip() or None
    calls = [{"id": ids.pop(0), "type": "function", "function": {
        "name": c.function.name,
        "arguments": json.dumps(dict(reversed(json.loads(c.function.arguments).items())), indent=2)}}
        for c in message.tool_calls or []]
    return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}


async def adding_program(task, endpoint, history):
    """Calls ``add`` until the model answers, sending every reply back re-serialised; reports the reward."""
    client = endpoint.client(max_retries=0)
    messages, ids = list(task["prompt"]), [f"call_{k:09d}" for k in range(8)]
    while True:
        reply = await client.chat.completions.create(model=endpoint.model, messages=messages, tools=[ADD])
        message = reply.choices[0].message
        messages.append(resend(message, ids))
        if not message.tool_calls:
            break
        for call, sent in zip(message.tool_calls, messages[-1]["tool_calls"]):
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": sent["id"], "content": str(args["a"] + args["b"])})
    history.extend(messages)
    await post(endpoint.reward_url, {"reward": float("14" in (message.content or ""))}, endpoint.api_key)
    await client.close()


def script_of(family):
    call, think = CALLS[family], THINK.get(family, "")
    return [think + call("add", {"a": 2, "b": 3}), think + call("add", {"a": 5, "b": 9}), think + "The answer is 14"]


@pytest.mark.parametrize("family", sorted(CALLS))
async def test_drift_the_trained_tokens_are_the_sampled_ones_whatever_the_client_sends_back(family):
    """Each family: a three-turn tool conversation whose client re-serialises every reply. The gateway
    trains exactly what the engine sampled, in one piece; re-rendering the client's final messages (what
    a proxy that re-tokenizes would train) does not hold those tokens."""
    history: list = []
    agent = Program(lambda task, endpoint: adding_program(task, endpoint, history))
    _, ctx, pieces = await episode(script_of(family), agent, family=family)
    traj = pieces[-1]
    assert traj.error is None and traj.termination == "answered", traj.error
    assert traj.reward == 1.0 and traj.reward_terms == {"agent": 1.0}
    sampled = [t for ids in ctx.engine.generated for t in ids]
    assert trained(pieces) == sampled
    assert all(p.logprobs == [-0.25 if m else 0.0 for m in p.response_mask] for p in pieces)
    renderer = ctx.schema_renderer([ADD])
    if appends_tool_results(renderer):  # one piece: every call's prompt was the trajectory so far
        live = traj.prompt_ids + traj.response_ids
        assert len(pieces) == 1 and traj.turns == 3 and all(live[:len(p)] == p for p in ctx.engine.prompts)
    else:  # Gemma 4's template writes tool results into the model's turn: each call is a segment of its
        # own, its prompt holding the earlier turns as sampled
        assert [p.turns for p in pieces] == [1, 1, 1]
        assert all(contains(pieces[k].prompt_ids, ctx.engine.generated[k - 1][:-1]) for k in (1, 2))
    final = template_messages([ChatMessage.model_validate(m) for m in history], renderer, [])
    try:
        naive = renderer.conversation_ids(final)
    except Exception:  # templates that take call arguments as JSON text, not as a mapping
        naive = renderer.conversation_ids([{**m, "tool_calls": [
            {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
            for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in final])
    assert not all(contains(naive, ids) for ids in ctx.engine.generated)


async def test_a_rewritten_history_and_concurrent_calls_are_segments_each_sampled_token_trained_once():
    """A program that calls twice at once (sub-agents), then summarises its history: four segments,
    every generation in exactly one, the last answer's segment last."""

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        first = [{"role": "user", "content": "sub-task A"}]
        second = [{"role": "user", "content": "sub-task B"}]
        a, b = await asyncio.gather(*(client.chat.completions.create(model=endpoint.model, messages=m)
                                      for m in (first, second)))
        turn = [*task["prompt"], {"role": "assistant", "content": a.choices[0].message.content},
                {"role": "user", "content": "go on"}]
        await client.chat.completions.create(model=endpoint.model, messages=turn)
        summary = [{"role": "user", "content": "Summary so far: A and B done. Answer."}]
        await client.chat.completions.create(model=endpoint.model, messages=summary)
        await client.close()
        return 0.5

    _, ctx, pieces = await episode(["one", "two", "three", "four"], program, family="qwen3", setting=dict(delay=0.05))
    assert len(pieces) == 4 and [p.piece for p in pieces] == [0, 1, 2, 3]
    assert [p.termination for p in pieces] == ["forked"] * 3 + ["answered"]
    assert {p.trajectory_key for p in pieces} == {"t0"} and pieces[-1].trajectory_id == "t0"
    assert sorted(map(tuple, (trained([p]) for p in pieces))) == sorted(map(tuple, ctx.engine.generated))
    assert all(p.reward == 0.5 for p in pieces) and pieces[-1].final_response == "four"


async def test_n_choices_fork_and_step_rewards_name_their_call():

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        reply = await client.chat.completions.create(model=endpoint.model, messages=task["prompt"], n=3)
        assert len(reply.choices) == 3
        key, url = endpoint.api_key, endpoint.reward_url
        ok = await post(url, {"reward": 0.25, "call_id": reply.id}, key)
        bad = await post(url, {"reward": 1, "call_id": "chatcmpl-nope"}, key)
        nan = await post(url, {"reward": "lots"}, key)
        assert (ok[0], bad[0], nan[0]) == (200, 404, 400)
        await client.close()
        return 1.0

    _, ctx, pieces = await episode(["maybe"], program)
    assert len(pieces) == 3 and trained(pieces) == [t for ids in ctx.engine.generated for t in ids]
    assert pieces[-1].reward_terms == {"agent": 1.0, "steps": 0.25}


async def test_streaming_answers_with_the_calls_as_the_openai_client_reads_them():
    seen = {}

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        stream = await client.chat.completions.create(model=endpoint.model, messages=task["prompt"], tools=[ADD],
                                                      stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        seen["calls"] = [tc.function for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        seen["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        seen["usage"] = chunks[-1].usage
        models = await client.models.list()
        seen["models"] = [m.id for m in models.data]
        await client.close()
        return 1.0

    await episode([hermes("add", {"a": 2, "b": 3})], program, model="policy")
    assert [(f.name, json.loads(f.arguments)) for f in seen["calls"]] == [("add", {"a": 2, "b": 3})]
    assert seen["finish"] == "tool_calls" and seen["usage"].completion_tokens > 0 and seen["models"] == ["policy"]


async def test_bad_requests_get_the_openai_apis_errors_and_the_episode_goes_on():
    statuses = {}

    async def program(task, endpoint):
        key = endpoint.api_key
        body = {"model": endpoint.model, "messages": task["prompt"]}
        chat = f"{endpoint.base_url}/chat/completions"
        statuses["no key"] = (await post(chat, body))[0]
        statuses["wrong key"] = (await post(chat, body, "x"))[0]
        statuses["not json"] = (await post(chat, key=key, content=b"{"))[0]
        statuses["no messages"] = (await post(chat, {"model": endpoint.model}, key))[0]
        statuses["model"] = (await post(chat, {**body, "model": "gpt-9"}, key))[0]
        statuses["tools"] = (await post(chat, {**body, "tools": [{"x": 1}]}, key))[0]
        other = endpoint.base_url.replace("/e/t0/", "/e/t1/")
        statuses["episode"] = (await post(f"{other}/chat/completions", body, key))[0]
        statuses["param"] = (await post(chat, {**body, "temperature": 9}, key))[1]["error"]["param"]
        statuses["ok"] = (await post(chat, body, key))[0]
        return 1.0

    _, ctx, pieces = await episode(["fine"], program)
    assert statuses == {"no key": 401, "wrong key": 401, "not json": 400, "no messages": 400, "model": 404,
                        "tools": 400, "episode": 404, "param": "temperature", "ok": 200}
    assert pieces[-1].termination == "answered" and pieces[-1].turns == 1


@pytest.mark.parametrize(("run", "rule", "termination", "error"), [
    ("crash", "mask", "infra_error", "RuntimeError: boom"),
    ("crash", "train", "error", "RuntimeError: boom"),
    ("hang", "mask", "infra_error", "deadline"),
    ("unscored", "mask", "infra_error", "no reward"),
    ("nonsense", "mask", "infra_error", "must be a number"),
])
async def test_a_failed_program_is_masked_by_default_or_trained_as_an_error(run, rule, termination, error):

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        await client.chat.completions.create(model=endpoint.model, messages=task["prompt"])
        await client.close()
        if run == "crash":
            raise RuntimeError("boom")
        if run == "hang":
            await asyncio.sleep(60)
        return "lots" if run == "nonsense" else None

    _, ctx, pieces = await episode(["hm"], program, failure=rule, timeout_s=2 if run == "hang" else 60)
    assert pieces[-1].termination == termination and error in pieces[-1].error
    assert trained(pieces) == ctx.engine.generated[0] and ctx.engine.ended  # the engine forgot its sessions


async def test_without_a_posted_reward_the_configured_reward_functions_score_the_last_answer():

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        await client.chat.completions.create(model=endpoint.model, messages=task["prompt"])
        await client.close()

    def exact(response, ground_truth, **info):
        return float(response.strip() == ground_truth)

    _, ctx, pieces = await episode(["14"], program, setting=dict(rewards=[("exact", 1.0, exact)]))
    assert pieces[-1].reward == 1.0 and pieces[-1].reward_terms == {"exact": 1.0}


async def test_the_response_budget_ends_the_episode_with_an_empty_length_answer():
    finishes = []

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        for _ in range(3):
            reply = await client.chat.completions.create(model=endpoint.model, messages=[
                {"role": "user", "content": f"again {len(finishes)}"}])
            finishes.append((reply.choices[0].finish_reason, reply.choices[0].message.content))
        await client.close()
        return 0.0

    _, ctx, pieces = await episode(["word " * 40], program, setting=dict(max_response_tokens=40, max_new_tokens=32))
    assert finishes[0][0] == "length" and finishes[-1] == ("length", "")
    assert sum(len(p.response_ids) for p in pieces) <= 40 and pieces[-1].termination == "max_response_tokens"


async def test_a_group_of_programs_runs_concurrently_each_in_its_own_episode():
    tok = family_tokenizer("qwen2_5")
    running, peak, threads = [0], [0], set()

    async def program(task, endpoint):
        threads.add(threading.get_ident())
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        client = endpoint.client(max_retries=0)
        reply = await client.chat.completions.create(model=endpoint.model, messages=task["prompt"])
        await client.close()
        running[0] -= 1
        return float(len(reply.choices[0].message.content))

    ctx = context(tok, "qwen2_5", ["abc"], Program(program), delay=0.05, max_concurrent_trajectories=8)
    try:
        trajs = await run_rollouts(ctx, [SAMPLE, SAMPLE.model_copy(update={"index": 1})], 4, 0)
    finally:
        await ctx.close()
    assert len(trajs) == 8 and peak[0] == 8 and len({t.trajectory_id for t in trajs}) == 8
    # on the agents' loop (toolrl.gateway.agent_loop), a thread apart from the one serving them
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert all(t.reward == 3.0 and t.termination == "answered" for t in trajs)


COMMAND_AGENT = textwrap.dedent('''
    import json, os, sys, urllib.request

    task = json.loads(os.environ["TOOLRL_TASK"])
    base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    if sys.argv[1:] == ["crash"]:
        sys.exit("the agent fell over")

    def post(url, body):
        request = urllib.request.Request(url, json.dumps(body).encode(), {
            "Authorization": "Bearer " + key, "Content-Type": "application/json"})
        return json.load(urllib.request.urlopen(request))

    model = json.load(urllib.request.urlopen(urllib.request.Request(
        base + "/models", headers={"Authorization": "Bearer " + key})))["data"][0]["id"]
    reply = post(base + "/chat/completions", {"model": model, "messages": task["prompt"]})
    answer = reply["choices"][0]["message"]["content"]
    post(os.environ["TOOLRL_REWARD_URL"], {"reward": float(answer == task["ground_truth"])})
''')


@pytest.mark.parametrize(("args", "termination", "reward"), [([], "answered", 1.0), (["crash"], "infra_error", 0.0)])
async def test_a_command_agent_is_a_program_with_the_endpoint_in_its_environment(tmp_path, args, termination, reward):
    (tmp_path / "agent.py").write_text(COMMAND_AGENT)
    agent = build_part("agents", "command", {"command": ["python", "agent.py", *args], "cwd": str(tmp_path)},
                       BuildContext("rollout.agent"))
    assert agent.argv()[0] == sys.executable
    _, ctx, pieces = await episode(["14"], agent)
    assert pieces[-1].termination == termination and pieces[-1].reward == reward
    if args:
        assert "the agent fell over" in pieces[-1].error


async def test_a_callable_agent_is_imported_by_reference_and_its_return_is_the_reward(tmp_path, monkeypatch):
    (tmp_path / "my_agent.py").write_text(textwrap.dedent('''
        async def run(task, client):
            reply = await client.chat.completions.create(model="toolrl", messages=task["prompt"])
            return float(reply.choices[0].message.content == task["ground_truth"])

        def not_async(task, client):
            return 1.0
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    agent = build_part("agents", "callable", {"callable": "my_agent:run"}, BuildContext("rollout.agent"))
    _, ctx, pieces = await episode(["14"], agent)
    assert pieces[-1].reward == 1.0 and pieces[-1].termination == "answered"
    broken = build_part("agents", "callable", {"callable": "my_agent:not_async"}, BuildContext("rollout.agent"))
    with pytest.raises(ValueError, match="not an async function"):
        broken.check_run(None)


async def test_256_concurrent_episodes_through_one_gateway_each_recorded_and_closed():
    """256 programs at once, two calls each, every one over its own connection pool (as separate
    programs are): each trajectory is its own two turns, and the gateway keeps nothing afterwards."""
    tok = family_tokenizer("qwen2_5")

    async def program(task, endpoint):
        headers = {"Authorization": f"Bearer {endpoint.api_key}"}
        messages = list(task["prompt"])
        async with aiohttp.ClientSession() as http:  # its own connection pool, as a separate program has
            for _ in range(2):
                async with http.post(f"{endpoint.base_url}/chat/completions", headers=headers,
                                     json={"model": endpoint.model, "messages": messages}) as reply:
                    messages += [(await reply.json())["choices"][0]["message"], {"role": "user", "content": "and?"}]
        return 1.0

    ctx = context(tok, "qwen2_5", ["yes"], Program(program), max_concurrent_trajectories=256)
    samples = [SAMPLE.model_copy(update={"index": i}) for i in range(64)]
    try:
        trajs = await run_rollouts(ctx, samples, 4, 0)
        gateway = await ctx.gateway()
        assert gateway.sessions == {}
    finally:
        await ctx.close()
    assert len(trajs) == 256 and all(t.termination == "answered" and t.turns == 2 for t in trajs)
    assert all(trained([t]) == ctx.engine.generated[0] * 2 for t in trajs)


def test_a_generation_that_ends_after_its_episode_changes_nothing():
    """A program cut at its deadline mid-call: its trajectory is made then; the generation finishing
    later (the engine was not told to stop) is not written into it, and a later call is a 404."""
    tok = family_tokenizer("qwen2_5")
    renderer = context(tok, "qwen2_5", ["x"], Program(None)).schema_renderer([])
    record = EpisodeRecord("t0", 0, 0)
    hi, more = (message_key(ChatMessage(role="user", content=text)) for text in ("hi", "more"))
    first = record.place([hi], "[]", renderer, [{"role": "user", "content": "hi"}])
    gen = scripted_generation(tok, "hello", SamplingParams(stop_token_ids=renderer.stop_ids))
    record.record(first, [gen], ["reply"], ["hello"], [[]], "hello")
    late = record.place([hi, "reply", more], "[]", renderer, [  # continues the segment: the same trajectory
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}])
    assert late.segment is first.segment
    pieces = record.pieces("infra_error")
    before = [p.model_dump() for p in pieces]
    record.record(late, [gen], ["k3"], ["hello"], [[]], "hello")
    assert [p.model_dump() for p in pieces] == before and trained(pieces) == gen.token_ids
    session = GatewaySession(record, None, lambda schemas: renderer, None, RolloutConfig(), 0, "toolrl")
    with pytest.raises(RequestError, match="the episode has ended") as ended:
        asyncio.run(session.turn([ChatMessage(role="user", content="again")], None, Ask()))
    assert ended.value.status == 404


async def test_a_template_refusal_is_a_400_and_a_bug_in_recording_a_logged_500(monkeypatch, caplog):
    """Only the template's own refusal blames the program's messages; a failure of the gateway's own code
    is a 500 whose traceback is logged."""
    two_calls = {"role": "assistant", "content": None, "tool_calls": [  # Llama 3's template takes one call a turn
        {"id": f"c{k}", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}} for k in (0, 1)]}
    answers = {}

    def broken(self, *args):
        raise KeyError("a bug in the record")

    async def program(task, endpoint):
        chat, key = f"{endpoint.base_url}/chat/completions", endpoint.api_key
        results = [{"role": "tool", "tool_call_id": f"c{k}", "content": "3"} for k in (0, 1)]
        answers["refused"] = await post(chat, {"model": endpoint.model, "tools": [ADD],
                                               "messages": [*task["prompt"], two_calls, *results]}, key)
        with monkeypatch.context() as patch:
            patch.setattr(EpisodeRecord, "_open", broken)
            answers["bug"] = await post(chat, {"model": endpoint.model, "messages": task["prompt"]}, key)
        answers["ok"] = (await post(chat, {"model": endpoint.model, "messages": task["prompt"]}, key))[0]
        return 1.0

    with caplog.at_level(logging.ERROR, logger="toolrl.gateway"):
        _, ctx, pieces = await episode(["fine"], program, family="llama3")
    status, body = answers["refused"]
    assert status == 400 and body["error"]["param"] == "messages"
    assert "cannot render these messages: This model only supports single tool-calls at once!" in body["error"]["message"]
    assert answers["bug"] == (500, {"error": {"message": "KeyError: 'a bug in the record'", "type": "server_error",
                                              "param": None, "code": 500}})
    logged = [r for r in caplog.records if r.name == "toolrl.gateway.server"]
    assert len(logged) == 1 and logged[0].exc_info[0] is KeyError
    assert answers["ok"] == 200 and pieces[-1].termination == "answered"


async def test_a_cancelled_call_is_abandoned_not_an_engine_failure():
    """A call given up while it generates (its program's deadline) is taken back out of its segment and
    flagged abandoned; it is no failure of the engine, which would fail the episode."""
    tok = family_tokenizer("qwen2_5")
    ctx = context(tok, "qwen2_5", ["slow"], Program(None), delay=60)
    session = GatewaySession(EpisodeRecord("t0", 0, 0), ctx.engine, ctx.schema_renderer, ctx.routes[None].parser,
                             ctx.config, 0, "toolrl")
    call = asyncio.ensure_future(session.turn([ChatMessage(role="user", content="hi")], None, Ask()))
    while not session.record.segments:
        await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    segment = session.record.segments[0]
    assert session.failures == [] and not segment.busy and session.record.calls == 0
    assert segment.traj.response_ids == [] and session.record.pieces("answered") == []


async def test_a_generation_without_a_token_is_recorded_only_an_abandoned_call_is_not():
    """Whether a call was taken back is its flag (Call.abandoned), not read from its answer's shape: an
    engine that had no room left answers an empty ``length`` generation, which is recorded (the call's
    segment is free again and the episode ends by length)."""

    class NoRoom(ScriptEngine):
        async def generate(self, prompt_ids, params, n=1, session_id=None, images=()):
            return [Generation([], [], "length") for _ in range(n)]

    tok = family_tokenizer("qwen2_5")
    ctx = context(tok, "qwen2_5", ["x"], Program(None))
    session = GatewaySession(EpisodeRecord("t0", 0, 0), NoRoom(tok, ["x"]), ctx.schema_renderer,
                             ctx.routes[None].parser, ctx.config, 0, "toolrl")
    turn = await session.turn([ChatMessage(role="user", content="hi")], None, Ask())
    assert turn.choices[0].finish == "length" and turn.choices[0].message["content"] == ""
    record = session.record
    assert record.calls == 1 and record.last_finish == "length" and not record.segments[0].busy
    abandoned = record.place(["k"], "[]", ctx.schema_renderer([]), [{"role": "user", "content": "hi"}])
    record.abandon(abandoned)
    assert abandoned.abandoned and not abandoned.segment.busy


async def test_a_tool_choice_naming_no_tool_is_refused_as_each_api_refuses_it():
    answers = {}
    schema = ADD["function"]["parameters"]

    async def program(task, endpoint):
        base, key, model = endpoint.base_url, endpoint.api_key, endpoint.model
        chat = {"model": model, "messages": task["prompt"], "tools": [ADD]}
        answers["chat"] = await post(f"{base}/chat/completions", {
            **chat, "tool_choice": {"type": "function", "function": {"name": "mul"}}}, key)
        answers["responses"] = await post(f"{base}/responses", {
            "model": model, "input": "2+3?", "tools": [{"type": "function", "name": "add", "parameters": schema}],
            "tool_choice": {"type": "function", "name": "mul"}}, key)
        answers["named"] = (await post(f"{base}/chat/completions", {
            **chat, "tool_choice": {"type": "function", "function": {"name": "add"}}}, key))[0]
        return 1.0

    await episode(["fine"], program)
    error = {"message": "tool_choice: no function 'mul' in tools", "type": "invalid_request_error",
             "param": "tool_choice", "code": 400}
    assert answers["chat"] == answers["responses"] == (400, {"error": error})
    assert answers["named"] == 200


async def test_a_program_written_from_the_docs_table_reports_its_reward():
    """docs/agents.md's variable table, taken at its word: POST the JSON it shows to TOOLRL_REWARD_URL,
    nothing else (no header: the URL is the episode's own). The episode is scored, not masked."""
    row = next(line for line in (ROOT / "docs" / "agents.md").read_text().splitlines()
               if line.startswith("| `TOOLRL_REWARD_URL` |"))
    said = re.match(r"\| `TOOLRL_REWARD_URL` \| POST `(\{[^`]*\})` here", row)
    assert said is not None and "header" in row  # the row says what to send, and that no header is needed
    answers = []

    async def program(task, endpoint):
        env = endpoint.environ()
        client = endpoint.client(max_retries=0)
        await client.chat.completions.create(model=env["TOOLRL_MODEL"], messages=task["prompt"])
        await client.close()
        async with aiohttp.ClientSession() as http, http.post(
                env["TOOLRL_REWARD_URL"], data=said.group(1).replace("x", "0.75")) as answer:
            answers.append(answer.status)

    _, ctx, pieces = await episode(["14"], program)
    assert answers == [200] and pieces[-1].reward == 0.75 and pieces[-1].termination == "answered"


CLASHING_PROTOCOLS = '''
from toolrl import hookimpl
from toolrl.gateway.chat_completions import ChatCompletions


class Again(ChatCompletions):
    """Another protocol on chat completions' path."""


@hookimpl
def register_gateway_protocols(register):
    register("protocols_gone:Missing", name="gone")
    register(Again, name="again")  # before chat_completions by name: the built-in keeps its path all the same
'''


async def test_a_protocol_that_fails_to_load_or_finds_its_path_taken_is_its_plugins_error_not_the_gateways(
        tmp_path, monkeypatch, toolrl_reload_plugins, caplog):
    load_plugin(tmp_path, monkeypatch, toolrl_reload_plugins, "toolrl-plugin-protocols", "protocols",
                "protocols_plugin", CLASHING_PROTOCOLS)
    gateway = await Gateway().start()
    await gateway.close()
    assert gateway.protocols[:2] == [ChatCompletions, Responses] and "Again" not in str(gateway.protocols)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("gateway protocol 'gone' (plugin 'protocols') not served" in w and "protocols_gone" in w for w in warned)
    taken = "gateway protocol 'again' (plugin 'protocols') not served: ChatCompletions serves /v1/chat/completions"
    assert taken in warned
    info = {i.name: i for i in toolrl_reload_plugins().list()}["protocols"]
    assert info.status == "error" and taken in info.error and "protocols_gone" in info.error
