"""A teacher is any engine that scores: an engine plugin, written here against the public API only,
checked and built as the run's engine is, scores every step's trajectories, and its log-probs reach the
step's advantages; an engine that does not score given tokens is refused as a teacher before any model
loads."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from _dists import load_plugin
from test_config_errors import invoke, one_error_line, write_config
from toolrl import model_sources
from toolrl.algorithms import build_estimator
from toolrl.config import Config
from toolrl.model_sources import tiny_qwen3
from toolrl.rollout.teacher import open_teachers
from toolrl.training.step import token_advantages
from toolrl.trajectory import Trajectory

SCORER = '''
from toolrl import hookimpl
from toolrl.engines import CoreEngineOptions, PromptLogprobs, RolloutEngine, score_starts


class TokenScorer(RolloutEngine):
    """Scores token t of any prompt -(t % 5) * step, whatever comes before it."""

    name = "token_scorer"

    class Options(CoreEngineOptions):
        step: float = 0.25

    def __init__(self, step):
        self.step = step

    @classmethod
    def create(cls, source, config):
        return cls(config["step"])

    async def generate(self, prompt_ids, params, n=1, session_id=None, adapter=None):
        raise NotImplementedError("token_scorer only scores")

    def update_weights(self, state_dict):
        pass

    async def prompt_logprobs(self, prompts, top=0, start=0):
        scored = []
        for ids, first in zip(prompts, score_starts(prompts, start)):
            lps = [-(t % 5) * self.step for t in ids[first:]]
            best = [[(k, -k * self.step) for k in range(top)] for _ in lps]
            scored.append(PromptLogprobs(lps, [1] * len(lps), best))
        return scored


class Mute(TokenScorer):
    """Generates like an engine, scores nothing: RolloutEngine.prompt_logprobs as it is."""

    name = "mute"
    prompt_logprobs = RolloutEngine.prompt_logprobs


@hookimpl
def register_rollout_engines(register):
    register(TokenScorer, name="token_scorer")
    register(Mute, name="mute")
'''


def distil_from(tmp_path, engine: str, **options):
    teacher = {"engine": engine, "model": "tiny-qwen3", "options": options}
    return write_config(tmp_path, rollout={"n": 2, "max_response_tokens": 8, "max_turns": 1}, data={"batch_size": 2},
                        algorithm={"advantage": "opd", "teacher": teacher})


def test_an_engine_plugin_scores_as_a_teacher_built_as_the_run_builds_it(tmp_path, monkeypatch, toolrl_reload_plugins):
    """Its log-probs of the sampled tokens (none at a tool result's), and opd's advantages from them."""
    load_plugin(tmp_path, monkeypatch, toolrl_reload_plugins, "toolrl-plugin-scorer", "scorer", "scorer_engine", SCORER)
    config = Config(env="arithmetic", algorithm={"advantage": "opd", "teacher": {
        "engine": "token_scorer", "model": "tiny-qwen3", "options": {"step": 0.5}}})
    trajs = [Trajectory(trajectory_id=f"t{k}", sample_index=0, group=0, prompt_ids=[11, 12, 13], reward=0.0,
                        response_ids=[20 + k, 31, 32, 43 + k], response_mask=[1, 0, 0, 1], logprobs=[-1.0, 0.0, 0.0, -2.0])
             for k in range(2)]

    async def scored() -> None:
        teachers = await open_teachers(config, model_sources.load_tokenizer(tiny_qwen3()), "algorithm.teacher")
        await teachers.score(trajs)
        await teachers.close()

    asyncio.run(scored())
    assert [t.teacher_logprobs for t in trajs] == [[-0.0, 0.0, 0.0, -1.5], [-0.5, 0.0, 0.0, -2.0]]
    grid = token_advantages(trajs, build_estimator(config.algorithm), 8, config.algorithm)
    assert torch.equal(grid, torch.tensor([[1.0, 0.0, 0.0, 0.5], [0.5, 0.0, 0.0, 0.0]]))


@pytest.mark.slow
def test_an_engine_plugin_teaches_a_training_run(tmp_path, monkeypatch, toolrl_reload_plugins):
    """``toolrl train`` with the plugin as teacher: every trace's teacher log-probs are its, and the step's
    advantages the teacher's less the engine's."""
    load_plugin(tmp_path, monkeypatch, toolrl_reload_plugins, "toolrl-plugin-scorer", "scorer", "scorer_engine", SCORER)
    result = invoke("train", str(distil_from(tmp_path, "token_scorer", step=0.5)))
    assert result.exit_code == 0, result.stderr
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert "teacher_s" in row and "teacher_wait_s" in row
    traces = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    assert len(traces) == 4
    for t in traces:
        mask = t["response_mask"]
        teacher = [-(i % 5) * 0.5 if m else 0.0 for i, m in zip(t["response_ids"], mask, strict=True)]
        assert t["teacher_logprobs"] == teacher
        # opd's advantage: the teacher's log-prob less the engine's, at every trained token (weight 1).
        want = [(a - b) if m else 0.0 for a, b, m in zip(teacher, t["logprobs"], mask, strict=True)]
        assert max(abs(a - b) for a, b in zip(t["advantage"], want, strict=True)) < 1e-6


def test_an_engine_that_does_not_score_is_refused_as_a_teacher(tmp_path, monkeypatch, toolrl_reload_plugins):
    load_plugin(tmp_path, monkeypatch, toolrl_reload_plugins, "toolrl-plugin-scorer", "scorer", "scorer_engine", SCORER)
    one_error_line(invoke("train", str(distil_from(tmp_path, "mute")), "--check"), "algorithm.teacher.0.engine",
                   "the mute engine does not score given tokens")
    one_error_line(invoke("train", str(distil_from(tmp_path, "token_scorer", steps=2)), "--check"),
                   "algorithm.teacher.0", "engine.options.steps")
