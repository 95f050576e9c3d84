"""Training on TextWorld games end to end (`toolrl train`: the transformers engine, the trainer) with
the tiny random Qwen3, under gigpo (the views as anchor states) and tree_grpo (sessions cloned
mid-game), then `toolrl eval` on the held-out games."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from toolrl.cli import cli


def write_config(tmp_path, advantage: str) -> str:
    config = tmp_path / "tw.yaml"
    config.write_text(f"""
model: {{source: tiny-qwen3}}
env: textworld
env_options: {{rooms: 2, objects: 1, quest_length: 2, train_size: 4, test_size: 2, max_steps: 4}}
data: {{batch_size: 2}}
engine: {{name: transformers}}
rollout: {{n: 4, temperature: 1.0, max_new_tokens: 3, max_response_tokens: 4096}}
algorithm: {{advantage: {advantage}}}
optim: {{lr: 0.001, micro_batch_size: 8}}
trainer: {{total_steps: 2, save_every: 2, output_dir: {tmp_path / 'run'}, plot: false, progress: false}}
""")
    return str(config)


@pytest.mark.parametrize("advantage", ["gigpo", "tree_grpo"])
def test_two_steps_train_and_the_held_out_games_evaluate(tmp_path, advantage: str) -> None:
    config = write_config(tmp_path, advantage)
    overrides = ["rollout.tree={width: 2, depth: 1, turn: 1}"] if advantage == "tree_grpo" else []
    result = CliRunner().invoke(cli, ["train", config, *overrides])
    assert result.exit_code == 0, result.output[-3000:]
    traces = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_00002.jsonl").read_text().splitlines()]
    states = [s for t in traces for s in t["turn_states"]]
    if advantage == "gigpo":  # the session's views are the anchor states
        assert states and all(s.startswith("env:-= ") for s in states)
    else:  # the tree's leaves share their first turn: the same game state, cloned
        assert any(".r1" in t["trajectory_id"] for t in traces)
    assert all(t["turns"] >= 1 for t in traces)  # each game got at least the model's first command
    evaluated = CliRunner().invoke(cli, ["eval", config, "--output", str(tmp_path / "eval")])
    assert evaluated.exit_code == 0, evaluated.output[-3000:]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert (summary["num_samples"], summary["errors"], summary["infra_failures"]) == (2, 0, 0), summary
