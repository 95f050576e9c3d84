"""Agent frameworks from PyPI, unmodified, trained through the gateway: the OpenAI Agents SDK (its
Responses model and its Chat Completions model) and LangGraph, each running the example agent in
examples/agents/ (a function tool, the framework's own loop, nothing of toolrl), as a function in the
rollout's process and as a program of its own. What is trained is what the engine sampled, in one piece."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from gateway_kit import SAMPLE, episode, hermes, trained
from toolrl.plugins.parts import BuildContext, build_part
from toolrl.schemas import Sample

# Third-party frameworks and program processes: the slow part of the core tests (about 25 s in all).
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "agents"
SCRIPT = [hermes("add", {"a": 2, "b": 3}), hermes("add", {"a": 5, "b": 9}), "The answer is 14"]


def check(ctx, pieces):
    traj = pieces[-1]
    assert traj.error is None and traj.termination == "answered" and traj.reward == 1.0, traj.error
    assert len(pieces) == 1 and traj.turns == 3
    assert trained(pieces) == [t for ids in ctx.engine.generated for t in ids]


@pytest.mark.parametrize(("module", "api"), [("adder_sdk", "responses"), ("adder_sdk", "chat"),
                                             ("adder_langgraph", None)])
async def test_a_framework_agent_runs_unchanged_as_a_function(module, api, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    example = importlib.import_module(module)

    async def program(task, endpoint):
        client = endpoint.client(max_retries=0)
        return await (example.run(task, client, api) if api else example.run(task, client))

    _, ctx, pieces = await episode(SCRIPT, program)
    check(ctx, pieces)
    assert SAMPLE.ground_truth in pieces[-1].final_response


async def test_a_framework_agent_runs_unchanged_as_a_program_of_its_own():
    agent = build_part("agents", "command", {"command": ["python", str(EXAMPLES / "adder_sdk.py")]},
                       BuildContext("rollout.agent"))
    _, ctx, pieces = await episode(SCRIPT, agent)
    check(ctx, pieces)


async def test_a_task_of_its_own_tools_the_lookup_chain_as_an_sdk_program(monkeypatch):
    """examples/agents/lookup_sdk.py: a tool made per episode from the task (its chain of keys), a worked
    example in the model's own call format before the question, the reward from the program."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    example = importlib.import_module("lookup_sdk")
    task = Sample(prompt=[{"role": "user", "content": "Start at key A. Look up keys."}], ground_truth="777",
                  extra_info={"chain": ["A", "12", "777"]}, index=0)
    script = [hermes("lookup", {"key": "A"}), hermes("lookup", {"key": "12"}), "777"]

    async def program(task, endpoint):
        return await example.run(task, endpoint.client(max_retries=0))

    _, ctx, pieces = await episode(script, program, sample=task)
    check(ctx, pieces)
    assert '"key": "K"' in ctx.engine.tokenizer.decode(pieces[-1].prompt_ids)  # the worked example
