"""The ``openai`` engine against ``toolrl serve`` (token-exact rollouts, single- and multi-turn) and
against a small server that fails on purpose (retries, text-only answers, errors, concurrency)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support import (
    ANSWER,
    CALL,
    TINY_YAML,
    FakeServer,
    ServeProcess,
    free_port,
    recorded,
    rollout_rows,
    text_completion,
    toolrl,
)
from toolrl.config import ConfigError
from toolrl.engines import ModelSource, SamplingParams
from toolrl_openai.engine import OpenAIEngine, OpenAIEngineError

ROLLOUT = ("trainer.total_steps=1", "data.batch_size=1", "rollout.n=2", "trainer.progress=false",
           "trainer.plot=false", "engine.name=openai")


def _rollout(server: ServeProcess, out: Path, *extra: str) -> list[dict[str, Any]]:
    result = toolrl("rollout", str(TINY_YAML), *ROLLOUT, f"engine.options.base_url={server.url}",
                    f"trainer.output_dir={out}", *extra)
    assert result.exit_code == 0, result.output[-3000:]
    rows = rollout_rows(out)
    assert len(rows) == 2 and all(r["error"] is None for r in rows), [r["error"] for r in rows]
    return rows


def _served_twins(server: ServeProcess, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The server's recordings of the trajectory the client recorded as ``row`` (a scripted model
    gives every trajectory of a group the same tokens, so there may be several)."""
    ids = row["prompt_ids"] + row["response_ids"]
    twins = recorded(server, 1, lambda r: r["prompt_ids"] + r["response_ids"] == ids)
    assert twins, "the server recorded no such trajectory"
    return twins


def test_rollout_through_toolrl_serve_is_token_exact(tiny_server: ServeProcess, tmp_path: Path,
                                                     tiny_path: str) -> None:
    import torch
    from toolrl import model_sources

    rows = _rollout(tiny_server, tmp_path / "run")
    model = model_sources.load_model(tiny_path)
    for row in rows:
        # The client's trajectory is the served engine's, id for id and logprob for logprob.
        for twin in _served_twins(tiny_server, row):
            assert (twin["prompt_ids"], twin["response_mask"], twin["logprobs"]) == \
                (row["prompt_ids"], row["response_mask"], row["logprobs"])
        # And those logprobs are the model's own for exactly these tokens (temperature 1).
        ids = row["prompt_ids"] + row["response_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        start = len(row["prompt_ids"])
        expect = torch.log_softmax(logits[start - 1:-1], -1).gather(1, torch.tensor(ids[start:])[:, None])[:, 0]
        got = torch.tensor(row["logprobs"])
        mask = torch.tensor(row["response_mask"], dtype=torch.bool)
        assert mask.any()
        torch.testing.assert_close(got[mask], expect[mask], atol=2e-4, rtol=0)


def test_multi_turn_rollout_through_toolrl_serve(scripted_server: ServeProcess, tmp_path: Path,
                                                 tokenizer: Any) -> None:
    """The scripted model calls the calculator, the rollout runs it and sends prompt + response +
    the tool's template delta as the next prompt; the server continues the same conversation."""
    rows = _rollout(scripted_server, tmp_path / "run", "rollout.max_new_tokens=64", "rollout.max_response_tokens=256")
    for row in rows:
        assert row["turns"] == 2 and row["termination"] == "answered"
        assert [(r["name"], r["status"], r["response"]["text"]) for r in row["tool_results"]] == \
            [("calculator", "ok", "5")]
        model = tokenizer.decode([t for t, m in zip(row["response_ids"], row["response_mask"]) if m])
        assert model == f"{CALL}<|im_end|>{ANSWER}<|im_end|>"
        for twin in _served_twins(scripted_server, row):
            assert twin["turns"] == 2  # both requests of the trajectory: one served conversation
            assert (twin["prompt_ids"], twin["response_mask"], twin["logprobs"]) == \
                (row["prompt_ids"], row["response_mask"], row["logprobs"])


async def test_engine_knows_it_is_token_exact(tiny_server: ServeProcess, tiny_path: str, tokenizer: Any) -> None:
    engine = OpenAIEngine.create(ModelSource(tiny_path, tokenizer=tokenizer), {"base_url": tiny_server.url})
    try:
        assert engine.model == "tiny-qwen3"  # the server's only model
        assert engine.token_exact is None
        assert await engine.check_trainable() is None  # asks the server once
        assert engine.token_exact is True
        params = SamplingParams(max_new_tokens=6, seed=7, stop_token_ids=[tokenizer.eos_token_id])
        prompt = tokenizer.encode("2+3=", add_special_tokens=False)
        a, b = await asyncio.gather(engine.generate(prompt, params), engine.generate(prompt, params))
        assert a[0].token_ids == b[0].token_ids and len(a[0].token_ids) == len(a[0].logprobs) > 0
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-4)
    finally:
        await engine.close()


# -- failures, retries, text-only servers -------------------------------------------------------


def _engine(server: FakeServer, tiny_path: str, tokenizer: Any, **options: Any) -> OpenAIEngine:
    return OpenAIEngine.create(ModelSource(tiny_path, tokenizer=tokenizer),
                               {"base_url": server.url, "retry_base_s": 0.01, "retry_max_s": 0.05, **options})


PARAMS = SamplingParams(max_new_tokens=8, stop_token_ids=[151645])  # <|im_end|>


async def test_retries_then_text_only_answer_is_not_token_exact(tiny_path: str, tokenizer: Any) -> None:
    async def handler(call: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if call == 1:
            return 429, {"error": {"message": "slow down"}}
        if call == 2:
            return 503, {"error": {"message": "overloaded"}}
        return 200, text_completion(" 5")

    server = FakeServer(handler)
    engine = _engine(server, tiny_path, tokenizer)
    try:
        assert engine.model == "hosted-model"
        (gen,) = await engine.generate([1, 2, 3], PARAMS)
        assert len(server.bodies) == 3  # two failures retried, then the answer
        assert server.bodies[-1]["prompt"] == [1, 2, 3] and server.bodies[-1]["return_tokens_as_token_ids"]
        # Text only: re-tokenized, the end of turn restored, no logprobs; evaluation only.
        assert gen.token_ids == tokenizer.encode(" 5", add_special_tokens=False) + [151645]
        assert gen.finish_reason == "stop" and gen.logprobs == [0.0] * len(gen.token_ids)
        assert engine.token_exact is False
        reason = await engine.check_trainable()
        assert reason is not None and "not token-exact" in reason and server.url in reason
        assert "\n" not in reason
    finally:
        await engine.close()
        server.close()


async def test_text_mode_sends_plain_openai_requests(tiny_path: str, tokenizer: Any) -> None:
    async def handler(call: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, text_completion("<calculator>2+3")

    server = FakeServer(handler)
    engine = _engine(server, tiny_path, tokenizer, token_exact=False)
    try:
        prompt = tokenizer.encode("Q: 2+3?", add_special_tokens=False)
        await engine.generate(prompt, SamplingParams(max_new_tokens=8, stop_strings=["</calculator>"]))
        body = server.bodies[0]
        assert body["prompt"] == "Q: 2+3?" and body["stop"] == ["</calculator>"]
        assert not {"return_tokens_as_token_ids", "stop_token_ids", "ignore_eos", "logprobs"} & set(body)
        assert "token_exact is false" in (await engine.check_trainable() or "")
    finally:
        await engine.close()
        server.close()


async def test_token_exact_true_refuses_text(tiny_path: str, tokenizer: Any) -> None:
    async def handler(call: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, text_completion("hi")

    server = FakeServer(handler)
    engine = _engine(server, tiny_path, tokenizer, token_exact=True)
    try:
        with pytest.raises(OpenAIEngineError, match="returned no token ids"):
            await engine.generate([1, 2], PARAMS)
    finally:
        await engine.close()
        server.close()


async def test_generations_report_the_served_weights_version(tiny_path: str, tokenizer: Any) -> None:
    async def handler(call: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, text_completion(" 5")

    server = FakeServer(handler)
    engine = _engine(server, tiny_path, tokenizer, weight_version=3)
    try:
        (gen,) = await engine.generate([1, 2, 3], PARAMS)
        assert gen.weight_version == 3
        with engine.updating_weights(4):  # a trainer's push: no weights reach the server
            engine.update_weights({})
        (gen,) = await engine.generate([1, 2, 3], PARAMS)
        assert gen.weight_version == engine.weight_version == 3
    finally:
        await engine.close()
        server.close()


async def test_client_errors_are_not_retried_and_retries_end(tiny_path: str, tokenizer: Any) -> None:
    async def handler(call: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["max_tokens"] == 1:
            return 400, {"error": {"message": "max_tokens is too small\nsecond line"}}
        return 500, {"error": {"message": "boom"}}

    server = FakeServer(handler)
    engine = _engine(server, tiny_path, tokenizer, max_retries=2)
    try:
        with pytest.raises(OpenAIEngineError) as bad:
            await engine.generate([1], SamplingParams(max_new_tokens=1))
        assert str(bad.value) == f"{server.url} answered 400 max_tokens is too small"
        assert len(server.bodies) == 1
        with pytest.raises(OpenAIEngineError) as failed:
            await engine.generate([1], PARAMS)
        assert str(failed.value) == f"{server.url} answered 500 boom (after 3 attempts)"
        assert len(server.bodies) == 4
    finally:
        await engine.close()
        server.close()


async def test_concurrency_cap(tiny_path: str, tokenizer: Any) -> None:
    async def handler(call: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        await asyncio.sleep(0.2)
        return 200, text_completion("x")

    server = FakeServer(handler)
    engine = _engine(server, tiny_path, tokenizer, max_concurrency=2)
    try:
        await asyncio.gather(*(engine.generate([1, 2], PARAMS) for _ in range(6)))
        assert len(server.bodies) == 6 and server.max_in_flight == 2
    finally:
        await engine.close()
        server.close()


async def test_server_down_is_one_line(tiny_path: str, tokenizer: Any) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ConfigError) as down:
        OpenAIEngine.create(ModelSource(tiny_path, tokenizer=tokenizer), {"base_url": url})
    assert str(down.value).startswith(f"engine.options.base_url: no OpenAI-compatible server answers at {url} (")
    assert "\n" not in str(down.value)

    # Gone mid-run: each request fails after its retries, in one line naming the server.
    engine = OpenAIEngine.create(ModelSource(tiny_path, tokenizer=tokenizer),
                                 {"base_url": url, "model": "m", "check_server": False, "max_retries": 1,
                                  "retry_base_s": 0.01})
    try:
        with pytest.raises(OpenAIEngineError) as gone:
            await engine.generate([1], PARAMS)
        assert str(gone.value).startswith(f"cannot reach the OpenAI-compatible server at {url}: ")
        assert str(gone.value).endswith("(after 2 attempts)") and "\n" not in str(gone.value)
    finally:
        await engine.close()


def test_cli_reports_a_down_server_in_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = toolrl("rollout", str(TINY_YAML), *ROLLOUT, f"engine.options.base_url={url}",
                    f"trainer.output_dir={tmp_path}")
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, result.output[-2000:]
    assert lines[0].startswith(f"error: engine.options.base_url: no OpenAI-compatible server answers at {url} (")
    assert "Traceback" not in result.output


def test_bad_options_are_config_errors(tiny_path: str) -> None:
    with pytest.raises(ConfigError, match=r"engine.options: max_concurrency: Input should be greater"):
        OpenAIEngine.create(ModelSource(tiny_path), {"base_url": "http://x/v1", "max_concurrency": 0})
    with pytest.raises(ConfigError, match=r"engine.options: bogus: unknown key"):
        OpenAIEngine.create(ModelSource(tiny_path), {"base_url": "http://x/v1", "bogus": 1})


def test_a_misspelt_option_is_refused_at_the_check_before_any_server_is_asked(tmp_path: Path) -> None:
    """The engine's Options are checked by the run check: no server at that address is ever reached."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = toolrl("train", str(TINY_YAML), *ROLLOUT, f"engine.options.base_url={url}", "engine.options.max_retry=3",
                    f"trainer.output_dir={tmp_path / 'run'}", "--check")
    assert result.exit_code == 2, result.output[-2000:]
    assert result.stderr.strip() == ("error: override engine.options.max_retry=3: engine.options.max_retry: unknown "
                                     "key (did you mean 'max_retries'?)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("url", ["localhost:8000/v1", "not a url", "http://host:port/v1"])
def test_a_base_url_that_is_not_a_url_is_refused_at_the_check(tmp_path: Path, url: str) -> None:
    """Refused as not a URL (issue 85), not tried as a request to a server that cannot exist."""
    result = toolrl("train", str(TINY_YAML), *ROLLOUT, f"engine.options.base_url={url}",
                    f"trainer.output_dir={tmp_path / 'run'}", "--check")
    assert result.exit_code == 2, result.output[-2000:]
    assert result.stderr.startswith(f"error: override engine.options.base_url={url}: engine.options.base_url: "
                                    f"{url!r} is not a URL") and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "run").exists()
    teacher = f"algorithm.teacher={{engine: openai, model: tiny-qwen3, options: {{base_url: '{url}'}}}}"
    result = toolrl("train", str(TINY_YAML), *ROLLOUT, "engine={name: transformers}", "algorithm.advantage=opd",
                    teacher, f"trainer.output_dir={tmp_path / 'run'}", "--check")  # a served teacher's, the same
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output[-2000:]
    assert f": algorithm.teacher.0: engine.options.base_url: {url!r} is not a URL" in result.stderr, result.stderr


@pytest.mark.parametrize(("options", "fragments"), [
    ("", ["algorithm.teacher.0", "engine.options", "base_url"]),
    (", options: {model: t}", ["algorithm.teacher", "base_url"])])
def test_a_served_teacher_without_a_base_url_is_refused_at_the_check(tmp_path: Path, options: str,
                                                                      fragments: list[str]) -> None:
    """A served teacher's options are its engine's: one without ``base_url`` is refused before any model loads."""
    result = toolrl("train", str(TINY_YAML), *ROLLOUT, "engine={name: transformers}", "algorithm.advantage=opd",
                    f"algorithm.teacher={{engine: openai, model: tiny-qwen3{options}}}",
                    f"trainer.output_dir={tmp_path / 'run'}", "--check")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output[-2000:]
    assert all(f in result.stderr for f in fragments), result.stderr
    assert not (tmp_path / "run").exists()


def test_a_served_teacher_is_asked_at_the_start_of_a_run_not_by_check(tmp_path: Path) -> None:
    """``--check`` reaches no server (a served teacher needs only its tokenizer there); the run itself asks
    it before its first step and refuses, with one line naming the teacher, a server that does not answer."""
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    args = (str(TINY_YAML), *ROLLOUT, "engine={name: transformers}", "algorithm.advantage=opd",
            f"algorithm.teacher={{engine: openai, model: tiny-qwen3, options: {{base_url: '{url}'}}}}",
            "model.freeze_output_head=true",  # no warning line (opd under full fine-tuning) before the error
            f"trainer.output_dir={tmp_path / 'run'}")
    assert toolrl("train", *args, "--check").exit_code == 0
    result = toolrl("train", *args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output[-2000:]
    assert "algorithm.teacher.0 (engine openai)" in result.stderr, result.stderr
    assert f"no OpenAI-compatible server answers at {url}" in result.stderr, result.stderr


def test_train_refuses_a_text_only_server(tmp_path: Path) -> None:
    async def handler(call: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, text_completion("hi")

    server = FakeServer(handler)
    try:
        result = toolrl("train", str(TINY_YAML), *ROLLOUT, f"engine.options.base_url={server.url}",
                        f"trainer.output_dir={tmp_path}")
    finally:
        server.close()
    assert result.exit_code == 2
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert f"engine openai at {server.url} is not token-exact" in line


def test_an_adapter_per_role_is_refused_at_the_run_check():
    from toolrl.config import load_config
    from toolrl.processes.resolve import run_plan

    def config(**model: Any) -> Any:
        return load_config(None, data={"env": "arithmetic", "engine": {"name": "openai"}, "model": model})

    with pytest.raises(ConfigError, match=r"model.adapters: several policies need an engine that serves LoRA adapters "
                                          r"\(transformers, vllm\); the openai engine serves none"):
        run_plan(config(adapters={"planner": {"r": 4}}), engine_cls=OpenAIEngine)
    assert not run_plan(config(), engine_cls=OpenAIEngine).sync.adapters
