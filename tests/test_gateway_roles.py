"""Roles through the gateway: in a run with roles the model name a call asks for is the role that acts
in it, with the official ``openai`` client over real HTTP against the real gateway. ``GET /v1/models``
lists the roles, another name is each API's 404 naming them, every piece holds one role's calls, a
reward can be posted for a role, and under ``model.adapters`` the engine samples with the role's
adapter. The engine says a script (no weights needed to show what is recorded)."""

from __future__ import annotations

import dataclasses

import openai
import pytest
from family_tokenizers import family_tokenizer
from gateway_kit import SAMPLE, Program, ScriptEngine, context, post, trained
from toolrl.rollout import run_trajectory_pieces

ROLES = ("planner", "executor")


class AdapterEngine(ScriptEngine):
    """A scripted engine that takes the ``adapter`` keyword engines take under model.adapters, and keeps it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.adapters: list[str | None] = []

    async def generate(self, prompt_ids, params, n=1, session_id=None, images=(), adapter=None):
        self.adapters.append(adapter)
        return await super().generate(prompt_ids, params, n, session_id, images)


async def role_episode(script, program, roles=ROLES, adapters=False, sample=SAMPLE, **options):
    """One episode of ``program`` on ``sample`` in a run with ``roles``: (context, pieces)."""
    tok = family_tokenizer("qwen2_5")
    ctx = context(tok, "qwen2_5", script, Program(program, **options))
    engine = AdapterEngine(tok, script, logprob=-0.25) if adapters else ctx.engine
    ctx = dataclasses.replace(ctx, engine=engine, roles=tuple(roles), adapters=adapters)
    try:
        pieces = await run_trajectory_pieces(ctx, sample, 0, "t0", 0)
    finally:
        await ctx.close()
    return ctx, pieces


async def planner_executor(task, endpoint, seen):
    """The planner plans, the executor answers the plan, the planner goes on from its own conversation;
    the executor's reward is posted apart from the episode's."""
    client = endpoint.client(max_retries=0)
    seen["models"] = [m.id for m in (await client.models.list()).data]
    seen["endpoint"] = (endpoint.model, endpoint.roles, endpoint.environ().get("TOOLRL_ROLES"))
    plan = await client.chat.completions.create(model="planner", messages=task["prompt"])
    asked = [*task["prompt"], {"role": "assistant", "content": plan.choices[0].message.content},
             {"role": "user", "content": "carry it out"}]
    done = await client.chat.completions.create(model="executor", messages=asked)
    seen["answered_as"] = (plan.model, done.model)
    await client.chat.completions.create(model="planner", messages=asked)  # continues the planner's piece
    with pytest.raises(openai.NotFoundError) as refused:
        await client.chat.completions.create(model="gpt-9", messages=task["prompt"])
    seen["refused"] = refused.value.body
    key, url = endpoint.api_key, endpoint.reward_url
    seen["posts"] = [(await post(url, body, key)) for body in (
        {"reward": 1.0, "role": "executor"}, {"reward": 1.0, "role": "judge"},
        {"reward": 1.0, "role": "executor", "call_id": done.id})]
    await client.close()
    return 0.5


async def test_the_model_names_are_the_roles_each_piece_one_roles_and_a_role_has_its_reward():
    seen: dict = {}
    ctx, pieces = await role_episode(["plan: add", "added: 5", "next: check"],
                                     lambda task, endpoint: planner_executor(task, endpoint, seen))
    assert seen["models"] == ["planner", "executor"]
    assert seen["endpoint"] == ("planner", ROLES, "planner,executor")  # the default name is no role: the first
    assert seen["answered_as"] == ("planner", "executor")
    assert seen["refused"]["param"] == "model" and "'planner', 'executor'" in seen["refused"]["message"]
    statuses = [status for status, _ in seen["posts"]]
    assert statuses == [200, 400, 400]
    assert "'planner', 'executor'" in seen["posts"][1][1]["error"]["message"]
    assert seen["posts"][1][1]["error"]["param"] == "role"
    # Two pieces: the executor's call could have continued the planner's tokens, but a piece is one role's.
    assert [(p.role, p.turns) for p in pieces] == [("executor", 1), ("planner", 2)]
    assert [p.termination for p in pieces] == ["forked", "answered"]
    assert sorted(map(tuple, (trained([p]) for p in pieces))) == sorted(
        [tuple(ctx.engine.generated[1]), tuple(ctx.engine.generated[0] + ctx.engine.generated[2])])
    assert all(p.reward == 0.5 and p.role_rewards == {"executor": 1.0} for p in pieces)


async def test_under_adapters_each_call_is_sampled_with_its_roles_adapter():

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        for model in ("executor", "planner", "executor"):
            await client.chat.completions.create(model=model, messages=task["prompt"])
        await client.close()
        return 1.0

    ctx, pieces = await role_episode(["a", "b", "c"], program, adapters=True, model="executor")
    assert ctx.engine.adapters == ["executor", "planner", "executor"]
    assert sorted(p.role for p in pieces) == ["executor", "executor", "planner"]


async def test_a_data_row_names_the_model_its_program_is_given():
    given = []

    async def program(task, endpoint):
        given.append(endpoint.model)
        client = endpoint.client(max_retries=0)
        await client.chat.completions.create(model=endpoint.model, messages=task["prompt"])
        await client.close()
        return 1.0

    row = SAMPLE.model_copy(update={"extra_info": {"role": "executor"}})
    _, pieces = await role_episode(["fine"], program, sample=row)
    _, plain = await role_episode(["fine"], program)
    assert given == ["executor", "planner"] and [p.role for p in pieces + plain] == ["executor", "planner"]


async def test_an_episode_without_a_call_is_its_endpoint_models_role():

    async def program(task, endpoint):
        return 1.0

    _, (piece,) = await role_episode(["unused"], program, model="executor")
    assert (piece.role, piece.termination, piece.error) == ("executor", "infra_error", "the agent made no model call")


async def test_an_unknown_model_is_the_responses_apis_404_naming_the_roles():
    """Chat completions' is planner_executor's (above); Anthropic's, toolrl-plugin-anthropic's tests."""
    answers = {}

    async def program(task, endpoint):
        key, base = endpoint.api_key, endpoint.base_url
        answers["responses"] = await post(f"{base}/responses", {"model": "gpt-9", "input": "hi"}, key)
        answers["ok"] = await post(f"{base}/responses", {"model": "executor", "input": "hi"}, key)
        return 1.0

    _, pieces = await role_episode(["fine"], program)
    status, body = answers["responses"]
    assert status == 404 and body["error"]["param"] == "model" and "'planner', 'executor'" in body["error"]["message"]
    assert answers["ok"][0] == 200 and answers["ok"][1]["model"] == "executor"
    assert [p.role for p in pieces] == ["executor"]


async def test_a_run_without_roles_serves_its_one_model_and_takes_no_role_reward():
    seen = {}

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        seen["models"] = [m.id for m in (await client.models.list()).data]
        reply = await client.chat.completions.create(model=endpoint.model, messages=task["prompt"])
        seen["model"] = reply.model
        seen["role post"] = await post(endpoint.reward_url, {"reward": 1.0, "role": "planner"}, endpoint.api_key)
        seen["env"] = endpoint.environ()
        await client.close()
        return 1.0

    _, pieces = await role_episode(["fine"], program, roles=(), model="policy")
    assert seen["models"] == ["policy"] and seen["model"] == "policy" and "TOOLRL_ROLES" not in seen["env"]
    assert seen["role post"][0] == 400 and "none" in seen["role post"][1]["error"]["message"]
    assert [(p.role, p.role_rewards) for p in pieces] == [(None, {})]


TWO_ROLES = '''
"""A planner and an executor: the executor's reward posted apart from the episode's."""
import aiohttp


async def run(task, client, endpoint):
    plan = await client.chat.completions.create(model="planner", messages=task["prompt"], max_tokens=6)
    steps = [*task["prompt"], {"role": "assistant", "content": plan.choices[0].message.content or ""},
             {"role": "user", "content": "Carry it out."}]
    done = await client.chat.completions.create(model="executor", messages=steps, max_tokens=6)
    async with aiohttp.ClientSession() as http:
        # The tiny model's answers are noise: rewards that vary with them give the step a gradient.
        await http.post(endpoint.reward_url, json={"reward": float(len(done.choices[0].message.content or "") % 2),
                                                   "role": "executor"})
    return float(len(plan.choices[0].message.content or "") % 2)
'''


@pytest.mark.slow
def test_train_with_two_roles_records_each_pieces_role_and_each_roles_metrics(tmp_path, monkeypatch):
    import asyncio
    import json

    from test_gateway_train import agent_config
    from toolrl.config import load_config
    from toolrl.processes.controller import train_async

    (tmp_path / "two_roles.py").write_text(TWO_ROLES)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = agent_config(tmp_path, {"rollout": {"roles": ["planner", "executor"]}}, callable="two_roles:run")
    run = asyncio.run(train_async(load_config(str(path))))
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    traces = [json.loads(line) for line in (run / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    assert row["loss"] == row["loss"]  # a step trained (not NaN)
    assert {t["role"] for t in traces} == {"planner", "executor"}
    for role in ("planner", "executor"):
        assert {f"role/{role}/reward", f"role/{role}/success", f"role/{role}/trained_tokens"} <= set(row)
        assert row[f"role/{role}/trained_tokens"] == sum(sum(t["response_mask"]) for t in traces if t["role"] == role)
    executor = [t for t in traces if t["role"] == "executor"]
    assert row["role/executor/reward"] == sum(t["role_rewards"]["executor"] for t in executor) / len(executor)
