"""PPO with a critic learns: the aligned-token task of ``test_trainer.test_grpo_learns_a_learnable_task``
with ``algorithm.advantage=gae``. The critic's value loss falls as it learns the returns, and the
policy's reward rises over the same 16 steps."""

import asyncio
import json
import os

import pytest
from test_trainer import TINY, AlignedTokens, peaked_tiny_model  # noqa: F401  (a fixture, used by name)
from toolrl.config import load_config
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import Part

STEPS = 16


@pytest.mark.slow
def test_ppo_with_a_critic_lowers_its_value_loss_and_learns(tmp_path, peaked_tiny_model):  # noqa: F811
    from toolrl.processes.controller import train_async

    registry = get_plugins().registry
    if not registry.has("reward_functions", "aligned_tokens"):
        registry.add(Part("reward_functions", "aligned_tokens", "tests", AlignedTokens))
    cfg = load_config(TINY, [
        f"model.source={peaked_tiny_model}", f"trainer.output_dir={tmp_path}", f"trainer.total_steps={STEPS}",
        "trainer.plot=false", "trainer.progress=false", "trainer.save_every=100", "trainer.seed=0",
        "rollout.seed=0", "rollout.n=8", "rollout.max_new_tokens=12", "rollout.max_response_tokens=12",
        "rollout.temperature=1.0", "reward.functions=[{name: aligned_tokens}]", "optim.lr=5.0e-3",
        "optim.micro_batch_size=16", "tools.entries=[]", "algorithm.advantage=gae", "critic.lr=1.0e-3",
    ])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    asyncio.run(train_async(cfg))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    losses = [r["value_loss"] for r in rows]
    rewards = [r["reward_mean"] for r in rows]
    assert sum(losses[-4:]) / 4 < 0.5 * sum(losses[:2]) / 2, losses
    assert max(r["explained_variance"] for r in rows[-4:]) > 0.0, [r.get("explained_variance") for r in rows]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:2]) / 2 + 0.1, rewards
