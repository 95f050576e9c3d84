"""The real rollout loop (scripted engine, real tokenizer, chat template and parser) with every kind
of faulty tool: every trajectory is kept, every fault reaches the model as a tool error, and nothing
non-finite reaches rewards or metrics."""

import json
import math

from faulty_tools import (
    BlocksLoop,
    Echo,
    Exits,
    Floods,
    HangsAsync,
    IgnoresCancel,
    NanReward,
    Raises,
    Returns,
    SyncSleeps,
)
from toolrl.config import RewardConfig, RolloutConfig
from toolrl.parsers.hermes import HermesParser
from toolrl.processes.controller import rollout_metrics
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, Route, run_rollouts
from toolrl.schemas import Sample
from toolrl.testing import ScriptedEngine
from toolrl.tools.isolation import ProcessTool


def call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


class NanScore:
    """A reward function whose output is not a number a loss can use."""

    def __call__(self, response, ground_truth, **info):
        return float("nan") if info["sample"].extra_info.get("nan_score") else 1.0


# (tool, execute_kwargs, what the model must read back)
CASES = {
    "raises": ({}, "RuntimeError: kaboom"),
    "hangs_async": ({}, "timed out after 0.5 s"),
    "blocks_loop": ({"block_s": 1.2}, "timed out after 0.5 s (it held the event loop"),
    "ignores_cancel": ({"sleep_s": 1.0}, "timed out after 0.5 s"),
    "sync_sleeps": ({"sleep_s": 2.0}, "timed out after 0.5 s"),
    "returns:bytes": ({"value": "bytes"}, "returned an invalid result: execute must return (response, step_reward, metrics), got bytes"),
    "returns:int_response": ({"value": "int_response"}, "returned an invalid result: response must be a str"),
    "returns:int": ({"value": "int"}, "returned an invalid result: execute must return"),
    "returns:list_metrics": ({"value": "list_metrics"}, "metrics must be a dict"),
    "returns:nan_reward": ({"value": "nan_reward"}, "step_reward must be finite, got nan"),
    "exits": ({}, "worker process exited with code 7"),
}


async def test_a_rollout_with_every_faulty_tool_keeps_every_trajectory(qwen3_tokenizer):
    tokenizer = qwen3_tokenizer
    exits = await ProcessTool.start(Exits, {"isolation": "process", "timeout": 30}, None)
    tools = {"raises": Raises(), "hangs_async": HangsAsync(), "blocks_loop": BlocksLoop(),
             "ignores_cancel": IgnoresCancel(), "sync_sleeps": SyncSleeps(), "returns": Returns(),
             "floods": Floods(), "exits": exits, "echo": Echo()}
    rewards = [("nan_score", 1.0, NanScore())]
    # Its calc_reward is NaN in every trajectory it is in.
    nan_route = Route({"nan_reward": NanReward()}, 4, HermesParser(), rewards, RewardConfig())
    samples, scripts = [], {}
    cases = [*CASES.items(), ("nan_reward", ({}, None)), ("floods", ({}, None)), ("echo", ({}, None))]
    for i, (case, (kwargs, _)) in enumerate(cases):
        tool = case.split(":")[0]
        args = {"x": 1} if tool == "exits" else {}
        samples.append(Sample(prompt=[{"role": "user", "content": f"use {tool}"}], index=i,
                              env="nan" if tool == "nan_reward" else None,
                              tools_kwargs={tool: {"execute_kwargs": kwargs}},
                              extra_info={"nan_score": case == "echo"}))
        scripts[f"s{i}-"] = [call(tool, **args), "#### done"]
    ctx = RolloutContext(
        engine=ScriptedEngine(tokenizer, scripts), renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
        config=RolloutConfig(max_turns=4, max_response_tokens=2048),
        routes={None: Route(tools, 4, HermesParser(), rewards, RewardConfig()), "nan": nan_route})
    try:
        trajs = await run_rollouts(ctx, samples, n=1, seed=0)
    finally:
        await exits.close()

    assert len(trajs) == len(cases)
    by_case = {case: t for (case, _), t in zip(cases, trajs)}
    for case, (_, expected) in CASES.items():
        traj = by_case[case]
        assert traj.termination == "answered" and traj.turns == 2, (case, traj.error)
        (result,) = traj.tool_results
        assert result.status in ("error", "timeout") and expected in result.response.text, (case, result)
        tool_message = tokenizer.decode(traj.response_ids[traj.response_mask.index(0):])
        assert expected[:40] in tool_message, (case, tool_message[:300])  # the model read it
    assert by_case["blocks_loop"].loop_blocked_s >= 1.0

    nan_tool = by_case["nan_reward"]
    assert nan_tool.tool_rewards == {} and "calc_reward must be finite" in nan_tool.tool_errors["nan_reward"]
    assert nan_tool.error and "nan_reward" in nan_tool.error
    flood = by_case["floods"]
    assert flood.tool_results[0].status == "ok" and "tokens truncated" in tokenizer.decode(flood.response_ids)
    assert flood.generation_s + flood.tool_s < 10  # the megabyte was cut before tokenizing
    scored = by_case["echo"]
    assert scored.reward_terms["nan_score"] == 0.0 and "reward nan_score" in scored.error
    assert "nan_score" in scored.reward_errors and not by_case["floods"].reward_errors

    assert all(math.isfinite(t.reward) for t in trajs)
    metrics = rollout_metrics(trajs, wall_s=1.0)  # used to die on a NaN step reward
    assert math.isfinite(metrics["reward_mean"]) and math.isfinite(metrics["reward_std"])
    assert metrics["errors"] >= 2
    assert metrics["tool_loop_blocked_s"] >= 1.0 and metrics["tool_lifecycle_errors"] >= 1
