"""Async reward functions (a judge model, a scoring service): the rollout loop awaits them without
holding the loop, a failing one is an error term in ``reward_errors``, and recorded rows are scored by
them too, also while a run is being resolved inside an event loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from toolrl.config import Config, RewardConfig, RolloutConfig
from toolrl.data.recorded import load_groups
from toolrl.parsers.hermes import HermesParser
from toolrl.renderers.chat import ChatRenderer
from toolrl.rewards.builtin import GSM8KReward
from toolrl.rollout import RolloutContext, Route, run_rollouts
from toolrl.schemas import Sample
from toolrl.testing import ScriptedEngine


class Gate:
    """An async reward that answers only once ``n`` judgements wait at once (or fails after 10 s)."""

    def __init__(self, n: int) -> None:
        self.n, self.waiting, self.most = n, 0, 0
        self.opened: asyncio.Event | None = None

    async def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        self.opened = self.opened or asyncio.Event()
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        if self.waiting >= self.n:
            self.opened.set()
        try:
            await asyncio.wait_for(self.opened.wait(), 10)
        finally:
            self.waiting -= 1
        return 0.5 if str(ground_truth) in response else 0.25


class Refuses:
    async def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        await asyncio.sleep(0)
        raise ConnectionError("the judge is down")


async def test_async_rewards_are_awaited_off_the_loop_and_failures_are_error_terms(qwen3_tokenizer: Any) -> None:
    gate = Gate(4)
    rewards = [("gsm8k", 1.0, GSM8KReward()), ("gate", 2.0, gate), ("refuses", 1.0, Refuses())]
    # Trajectory k answers after k + 1 turns: each's reward starts while the others still generate.
    scripts = {f"-{k}": ["<tool_call>\n{\"name\": \"none\", \"arguments\": {}}\n</tool_call>"] * k + ["#### 5"]
               for k in range(4)}
    ctx = RolloutContext(
        engine=ScriptedEngine(qwen3_tokenizer, scripts, delay_s=0.05),
        renderer_factory=lambda schemas: ChatRenderer(qwen3_tokenizer, schemas),
        # Two run at once: a trajectory gives up its slot before it is scored, or the gate never opens.
        config=RolloutConfig(max_turns=8, max_response_tokens=2048, max_concurrent_trajectories=2),
        routes={None: Route({}, 8, HermesParser(), rewards, RewardConfig())})
    sample = Sample(prompt=[{"role": "user", "content": "What is 2+3?"}], ground_truth="5", index=0)
    trajs = await run_rollouts(ctx, [sample], n=4, seed=0)

    assert gate.most == 4 and sorted(t.turns for t in trajs) == [1, 2, 3, 4]
    for t in trajs:
        assert t.reward_terms.items() >= {"gsm8k": 1.0, "gate": 1.0, "refuses": 0.0}.items() and t.reward == 2.0
        assert t.reward_errors == {"refuses": "ConnectionError: the judge is down"}
        assert t.error == "reward refuses: ConnectionError: the judge is down"


class Hangs:
    async def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        await asyncio.Event().wait()  # a judge that never answers
        return 1.0


async def test_an_async_reward_past_its_deadline_scores_zero_and_says_so(qwen3_tokenizer: Any) -> None:
    rewards = [("gsm8k", 1.0, GSM8KReward()), ("hangs", 1.0, Hangs())]
    ctx = RolloutContext(
        engine=ScriptedEngine(qwen3_tokenizer, ["#### 5"]),
        renderer_factory=lambda schemas: ChatRenderer(qwen3_tokenizer, schemas), config=RolloutConfig(),
        routes={None: Route({}, 4, HermesParser(), rewards, RewardConfig(timeout_s=0.2))})
    sample = Sample(prompt=[{"role": "user", "content": "What is 2+3?"}], ground_truth="5", index=0)
    [traj] = await asyncio.wait_for(run_rollouts(ctx, [sample], n=1, seed=0), 30)
    assert traj.reward_terms == {"gsm8k": 1.0, "hangs": 0.0} and traj.reward == 1.0
    assert traj.reward_errors == {"hangs": "TimeoutError: no value within 0.2 s (reward.timeout_s)"}


async def test_recorded_rows_are_scored_by_async_rewards_inside_a_running_loop(tmp_path: Path) -> None:
    rows = [{"trajectory_id": f"r{answer}", "prompt_ids": [1, 2], "response_ids": [3, 4], "response_mask": [1, 1], "logprobs": [-1.0, -1.0],
             "final_response": f"#### {answer}", "ground_truth": "5"} for answer in (5, 6)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = Config.model_validate({"model": {"source": "tiny-qwen3"}, "data": {"trajectories": [str(data)]}})
    # As resolve_run does inside train_async: a loop runs in this thread while the rows are scored.
    (group,) = load_groups(config, [("gsm8k", 1.0, GSM8KReward()), ("gate", 1.0, Gate(2))])
    assert sorted(t.reward for t in group.trajectories) == [0.25, 1.5]
    assert all(t.reward_errors == {} and t.error is None for t in group.trajectories)
