"""The ``verifiers`` environment on a verifiers tool environment written for the tests
(``envs/vf_adder_env.py``: three tasks, a task-scoped toolset of two tools, a rubric of two weighted
rewards): its tasks as samples, a scripted rollout calling its tools through the core's tool
lifecycle and the ``verifiers`` session, its rubric as the reward, a training step through
``toolrl train``, a broken ``load_environment`` as the one-line config error, and an evaluation
without a test split naming ``env_options.test_select``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from toolrl.config import ConfigError, load_config
from toolrl.data.sources import load_samples
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, run_rollouts
from toolrl.rollout.routes import build_routes
from toolrl.testing import ScriptedEngine

REPO = Path(__file__).resolve().parents[3]
TINY_YAML = REPO / "examples" / "tiny.yaml"
ADDER = {"env": "verifiers", "env_options": {"module": "vf_adder_env"}}


def rubric(terms: Mapping[str, float]) -> dict[str, float]:
    """The rubric's terms (the step rewards, all 0 here, are a term too)."""
    return {k: v for k, v in terms.items() if k.startswith("verifiers.")}


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_a_taskset_id_with_its_config(tmp_path: Path) -> None:
    prompt = tmp_path / "system.txt"
    prompt.write_text("Add, then answer.")
    samples = load_samples(load_config(None, data={"env": "verifiers", "env_options": {
        "module": "vf_adder_taskset", "args": {"system_prompt": str(prompt)}}}))
    assert [s.prompt[0].content for s in samples] == ["Add, then answer."] * 3
    assert samples[2].extra_info["verifiers"]["system_prompt"] == "Add, then answer."


def test_tasks_become_samples() -> None:
    samples = load_samples(load_config(None, data=ADDER))
    assert [s.prompt[1].content for s in samples] == ["What is 2 + 3?", "What is 10 + 32?", "What is 7 + 8?"]
    assert all(s.prompt[0].role == "system" and "calc_add" in s.prompt[0].content for s in samples)
    assert [s.ground_truth for s in samples] == ["5", "42", "15"] and {s.env for s in samples} == {"verifiers"}
    assert samples[1].extra_info["verifiers"]["idx"] == 1 and samples[1].tools_kwargs == {}
    limited = load_samples(load_config(None, data={**ADDER, "env_options": {
        "module": "vf_adder_env", "select": {"include": {"idx": ["1:3"]}}, "test_select": {"limit": 1}}}))
    assert [s.ground_truth for s in limited] == ["42", "15"]


async def test_scripted_rollout_calls_the_tools_and_the_rubric_is_the_reward(qwen3_tokenizer: Any) -> None:
    config = load_config(None, data={**ADDER, "rollout": {"max_turns": 4}})
    samples = load_samples(config)
    routes, parts = await build_routes(config, samples)
    assert routes["verifiers"].tools == {} and routes["verifiers"].session.name == "verifiers"
    scripts = {  # task 0 answers right with two calls; task 1 calls twice in one turn, answers wrong;
        # task 2 answers right after a call with bad arguments
        "s0-": [call("calc_add", a=2, b=3), call("calc_add", a=1, b=1) + call("calc_calls"), "The answer is 5"],
        "s1-": [call("calc_add", a=10, b=32) + call("calc_calls") + call("define", word="sum"), "The answer is 41"],
        "s2-": [call("calc_add", a="seven"), "The answer is 15"],
    }
    ctx = RolloutContext(engine=ScriptedEngine(qwen3_tokenizer, scripts, delay_s=0.01), config=config.rollout, routes=routes,
                         renderer_factory=lambda schemas: ChatRenderer(qwen3_tokenizer, schemas))
    try:
        first, second, third = await run_rollouts(ctx, samples, n=1, seed=0)
    finally:
        for part in parts:
            await part.close()

    # The session hands out the toolsets' tools with verifiers' names and schemas; the prompt shows them.
    prompt = qwen3_tokenizer.decode(first.prompt_ids)
    for name in ("calc_add", "calc_calls", "define"):
        assert f'"name": "{name}"' in prompt
    assert '"description": "Add two integers."' in prompt and '"required": ["a", "b"]' in prompt

    assert [(r.name, r.status, r.response.text) for r in first.tool_results] == [
        ("calc_add", "ok", "5"), ("calc_add", "ok", "2"), ("calc_calls", "ok", "task 0: 2 calls")]
    # The state is the trajectory's own: task 1's toolset counts its own call only.
    assert [r.response.text for r in second.tool_results] == ["42", "task 1: 1 calls", "the result of adding numbers"]
    assert third.tool_results[0].status == "invalid_arguments"
    assert first.error is None, first.error
    assert rubric(first.reward_terms) == {"verifiers.correct": 0.75, "verifiers.used_tool": 0.25} and first.reward == 1.0
    assert rubric(second.reward_terms) == {"verifiers.correct": 0.0, "verifiers.used_tool": 0.25} and second.reward == 0.25
    # A call that failed is a tool message all the same: the rubric counts it.
    assert rubric(third.reward_terms) == {"verifiers.correct": 0.75, "verifiers.used_tool": 0.25} and third.reward == 1.0
    assert all(t.error is None and t.termination == "answered" for t in (first, second, third))


def test_train_one_step_rubric_score_is_the_trace_reward(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from toolrl.cli import cli

    config = yaml.safe_load(TINY_YAML.read_text())
    config.update(ADDER)
    config.pop("env_options", None)
    config["env_options"] = ADDER["env_options"]
    config["data"] = {"batch_size": 2}
    config["rollout"].update({"n": 2, "max_new_tokens": 16, "max_response_tokens": 48})
    path = tmp_path / "verifiers.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["train", str(path), "trainer.total_steps=1", "trainer.progress=false",
                                      "trainer.plot=false", f"trainer.output_dir={out}"], catch_exceptions=False)
    assert result.exit_code == 0, result.output[-3000:]
    (metrics,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics["step"] == 1 and math.isfinite(metrics["grad_norm"])
    rows = [json.loads(line) for line in (out / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        # The rubric, by hand: 0.75 if the last reply ends with the answer, 0.25 if calc_add ran.
        correct = 0.75 * row["final_response"].strip().endswith(row["ground_truth"])
        used = 0.25 * any(r["name"] == "calc_add" for r in row["tool_results"])
        assert rubric(row["reward_terms"]) == {"verifiers.correct": correct, "verifiers.used_tool": used}, row["error"]
        assert row["reward"] == pytest.approx(correct + used)


def test_a_broken_load_environment_is_one_config_error(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from toolrl.cli import cli

    with pytest.raises(ConfigError, match=r"^env_options: environment 'verifiers': verifiers 'vf_broken_env': "
                       r"load_environment failed: FileNotFoundError: adder.jsonl: no such file"):
        load_samples(load_config(None, data={"env": "verifiers", "env_options": {"module": "vf_broken_env"}}))
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(TINY_YAML.read_text()), "env": "verifiers",
                                    "env_options": {"module": "vf_broken_env"}}))
    result = CliRunner().invoke(cli, ["train", str(path), f"trainer.output_dir={tmp_path / 'run'}"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "load_environment failed: FileNotFoundError" in lines[0], result.stderr
    missing = CliRunner().invoke(cli, ["train", str(path), "env_options.module=vf_no_such_env"])
    assert missing.exit_code == 2 and "vf_no_such_env" in missing.stderr and len(missing.stderr.splitlines()) == 1


def test_eval_without_a_test_split_names_test_select(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from toolrl.cli import cli

    path = tmp_path / "adder.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(TINY_YAML.read_text()), **ADDER}))
    result = CliRunner().invoke(cli, ["eval", str(path), "--output", str(tmp_path / "eval")])
    assert result.exit_code == 2 and "env_options.test_select" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
