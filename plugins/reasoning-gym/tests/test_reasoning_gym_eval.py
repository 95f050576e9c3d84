"""`toolrl eval` on three generators with the tiny model: the environment's test split, its metric,
each result's reward the generator's own score of what the model wrote."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl_reasoning_gym.reward import ReasoningGymReward


@pytest.mark.parametrize("generator", ["chain_sum", "spell_backward", "gcd"])
def test_eval_scores_each_answer_with_its_generator(tmp_path, generator):
    config = tmp_path / "eval.yaml"
    config.write_text(f"model: {{source: tiny-qwen3}}\nenv: reasoning_gym\n"
                      f"env_options: {{dataset: {generator}, size: 8, test_size: 4, seed: 3}}\n"
                      "rollout: {max_new_tokens: 12, max_response_tokens: 12}\n")
    out = tmp_path / "eval"
    result = CliRunner().invoke(cli, ["eval", str(config), "--output", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == "reasoning_gym" and summary["num_trajectories"] == 4
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    reward = ReasoningGymReward()
    for row in rows:
        truth = row["ground_truth"]
        assert truth["dataset"] == generator and truth["seed"] == 3 + 8  # the test split's seeds follow training's
        assert row["reward_terms"]["reasoning_gym"] == reward(row["response_text"], truth)
