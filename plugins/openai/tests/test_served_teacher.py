"""A distillation teacher on a server (``algorithm.teacher.engine: openai``, the openai engine's
``prompt_logprobs``): its log-probs of the student's sampled tokens, asked of ``toolrl serve`` for vLLM's
``prompt_logprobs``, equal the in-process transformers teacher's; servers that cannot score are refused
with one line naming the teacher."""

from __future__ import annotations

import asyncio
import copy

import pytest
from support import FakeServer, free_port, text_completion
from toolrl.config import Config, ConfigError
from toolrl.engines import ModelSource, SamplingParams
from toolrl.rollout.teacher import Teachers, open_teachers
from toolrl.trajectory import Trajectory

IN_PROCESS = {"model": "tiny-qwen3"}


def served(url: str) -> dict:
    return {"engine": "openai", "model": "tiny-qwen3", "options": {"base_url": url}}


async def teachers(tokenizer, teacher: dict, top: int = 0) -> Teachers:
    """``teacher`` built as a run builds it (it scores a probe first)."""
    config = Config(env="arithmetic", algorithm={"advantage": "opd", "teacher": teacher})
    return await open_teachers(config, tokenizer, "algorithm.teacher", top=top)


def scored(tokenizer, teacher: dict, trajectories: list[Trajectory], top: int = 0) -> None:
    """``trajectories`` scored by ``teacher`` in one event loop, as a run's (its engine's client lives there)."""
    async def run() -> None:
        built = await teachers(tokenizer, teacher, top)
        try:
            await built.score(trajectories)
        finally:
            await built.close()

    asyncio.run(run())


@pytest.fixture(scope="module")
def sampled(tiny_path, tokenizer) -> list[Trajectory]:
    """Three trajectories of the tiny model: a turn, a tool result (mask 0), a second turn."""
    from toolrl.engines.transformers import TransformersEngine

    engine = TransformersEngine.create(ModelSource(tiny_path), {"device": "cpu", "dtype": "float32"})
    tool = tokenizer.encode("<tool_response>\n42\n</tool_response>\n")

    async def one(seed: int) -> Trajectory:
        prompt = tokenizer.encode(f"What is {seed} times 7? Use the tool.")
        first = (await engine.generate(prompt, SamplingParams(max_new_tokens=5 + seed, seed=seed)))[0]
        second = (await engine.generate(prompt + first.token_ids + tool,
                                        SamplingParams(max_new_tokens=4, seed=seed + 7)))[0]
        mask = [1] * len(first.token_ids) + [0] * len(tool) + [1] * len(second.token_ids)
        return Trajectory(trajectory_id=f"t{seed}", sample_index=0, group=0, prompt_ids=prompt,
                          response_ids=first.token_ids + tool + second.token_ids, response_mask=mask,
                          logprobs=first.logprobs + [0.0] * len(tool) + second.logprobs, reward=0.0)

    async def all_of() -> list[Trajectory]:
        return [await one(seed) for seed in (1, 2, 3)]

    return asyncio.run(all_of())


def test_a_served_teacher_scores_as_the_in_process_one_and_tool_tokens_get_zero(tiny_server, tokenizer, sampled):
    here, there = copy.deepcopy(sampled), copy.deepcopy(sampled)
    scored(tokenizer, IN_PROCESS, here)
    scored(tokenizer, served(tiny_server.url), there)
    for a, b in zip(here, there, strict=True):
        assert b.teacher_logprobs is not None and len(b.teacher_logprobs) == len(b.response_ids)
        assert max(abs(x - y) for x, y in zip(a.teacher_logprobs, b.teacher_logprobs, strict=True)) < 1e-5
        assert all(v == 0.0 for v, m in zip(b.teacher_logprobs, b.response_mask, strict=True) if not m)
        assert all(v < 0.0 for v, m in zip(b.teacher_logprobs, b.response_mask, strict=True) if m)


def test_a_served_teachers_top_k_are_the_in_process_ones(tiny_server, tokenizer, sampled):
    """opd's ``top_k``: the server's ``prompt_logprobs: k`` entries ranked 1 to k give the same tokens and
    log-probs (within 1e-5) as the in-process teacher's top-k; tool-result tokens get none."""
    here, there = copy.deepcopy(sampled), copy.deepcopy(sampled)
    scored(tokenizer, IN_PROCESS, here, top=5)
    scored(tokenizer, served(tiny_server.url), there, top=5)
    for a, b in zip(here, there, strict=True):
        assert b.teacher_top_ids == a.teacher_top_ids
        assert all(len(row) == (5 if m else 0) for row, m in zip(b.teacher_top_ids, b.response_mask, strict=True))
        assert max(abs(x - y) for ra, rb in zip(a.teacher_top_logprobs, b.teacher_top_logprobs, strict=True)
                   for x, y in zip(ra, rb, strict=True)) < 1e-5


def test_a_served_teacher_sends_one_request_per_trajectory_at_once(tokenizer, sampled):
    """Through a server that answers late: the step's requests are all in flight together."""
    real = copy.deepcopy(sampled)

    async def slow(call: int, body: dict) -> tuple[int, dict]:
        await asyncio.sleep(0.3)
        answer = text_completion("")
        answer["choices"][0]["prompt_logprobs"] = [None] + [{str(t): {"logprob": -1.0, "rank": 1}}
                                                            for t in body["prompt"][1:]]
        return 200, answer

    server = FakeServer(slow, models=("tiny-qwen3",))
    try:
        scored(tokenizer, served(server.url), real)
        assert server.max_in_flight == len(real)
        assert all(b["prompt_logprobs"] == 0 and b["model"] == "tiny-qwen3" for b in server.bodies)
        for t in real:
            assert t.teacher_logprobs == [-1.0 if m else 0.0 for m in t.response_mask]
    finally:
        server.close()


def no_prompt_logprobs() -> FakeServer:
    async def answer(call: int, body: dict) -> tuple[int, dict]:
        return 200, text_completion("x")

    return FakeServer(answer, models=("tiny-qwen3",))


@pytest.mark.parametrize("kind", ["scripted", "no prompt_logprobs", "nothing listens"])
def test_a_server_that_cannot_score_is_refused_with_one_line(kind, scripted_server, tokenizer):
    fake = no_prompt_logprobs() if kind == "no prompt_logprobs" else None
    url = {"scripted": scripted_server.url, "nothing listens": f"http://127.0.0.1:{free_port()}/v1"}.get(kind) \
        or fake.url
    try:
        with pytest.raises(ConfigError) as err:
            asyncio.run(teachers(tokenizer, served(url)))
    finally:
        if fake is not None:
            fake.close()
    message = str(err.value)
    assert "\n" not in message and message.startswith("algorithm.teacher.0 (engine openai): ") and url in message
    expected = {"scripted": "chat_script engine does not score given tokens",
                "no prompt_logprobs": "does not return prompt log-probs",
                "nothing listens": "no OpenAI-compatible server answers"}
    assert expected[kind] in message


def test_a_training_run_distils_from_a_served_teacher(tiny_server, tmp_path):
    """``toolrl train`` with its teacher on ``toolrl serve`` (the student's own weights): every step's
    trajectories scored through the server, the advantages ~0, the teacher's log-probs in the traces."""
    import json

    from support import toolrl, write_config

    teacher = {"engine": "openai", "model": "tiny-qwen3", "options": {"base_url": tiny_server.url}}
    config = write_config(tmp_path / "distill.yaml", {
        "rollout": {"n": 2, "max_new_tokens": 8, "max_response_tokens": 8, "max_turns": 1},
        "data": {"batch_size": 2}, "algorithm": {"advantage": "opd", "teacher": teacher},
        "trainer": {"total_steps": 1, "output_dir": str(tmp_path / "run"), "progress": False, "plot": False}})
    result = toolrl("train", str(config))
    assert result.exit_code == 0, result.stderr
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["teacher_s"] > 0 and row["advantage_abs_mean"] < 1e-5
    traces = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    assert traces and all(len(t["teacher_logprobs"]) == len(t["response_ids"]) for t in traces)
