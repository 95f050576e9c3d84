"""The ``judge`` reward: a judge model served by ``toolrl serve`` grades ``toolrl eval``'s rollouts; a
judge that is down, answers garbage or fails gives an error reward term and the run completes; and
judgements run concurrently (with each other and with the rollout loop), up to ``concurrency``."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ServeProcess, env_with, free_port, recorded, toolrl, write_config

# The judge thinks aloud (quoting the verdict format, which must not count), then grades.
VERDICT = "<think>\nA grade looks like <score>0</score>.\n</think>\n\n<score>0.75</score>"

class JudgeServer:
    """A small OpenAI-style judge (starlette on uvicorn, in a thread): ``mode`` ``garbage`` answers
    200 with no verdict, ``broken`` answers 500, ``gate`` holds every request until ``gate`` are in
    flight at once (then grades ``<score>1</score>``; 503 if they never are). Counts requests in flight."""

    def __init__(self, mode: str, gate: int = 1, hold_s: float = 30.0) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route
        from toolrl_openai.server import bind

        self.prompts: list[str] = []
        self.in_flight = self.max_in_flight = 0
        opened: list[asyncio.Event] = []

        async def chat(request: Request) -> Response:
            body = json.loads(await request.body())
            self.prompts.append(body["messages"][-1]["content"])
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if mode == "broken":
                    return JSONResponse({"error": {"message": "judge crashed"}}, status_code=500)
                if mode == "garbage":
                    return JSONResponse(_chat_answer("banana " * 5))
                if mode == "not_json":
                    return Response("{'choices': [", media_type="application/json")
                if not opened:
                    opened.append(asyncio.Event())
                if self.in_flight >= gate:
                    opened[0].set()
                try:
                    await asyncio.wait_for(opened[0].wait(), hold_s)
                except asyncio.TimeoutError:
                    return JSONResponse({"error": {"message": "the gate never opened"}}, status_code=503)
                return JSONResponse(_chat_answer("<score>1</score>"))
            finally:
                self.in_flight -= 1

        app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
        self._sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])),
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


def built_judge(**options: Any) -> Any:
    """The judge as a run builds it (toolrl.plugins.parts.build_part): its options checked first."""
    from toolrl.plugins.parts import BuildContext, build_part

    return build_part("reward_functions", "judge", options, BuildContext(""))


def _chat_answer(text: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "judge",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


@pytest.fixture(scope="module", autouse=True)
def judge_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``toolrl serve`` on the tiny config (tiny Qwen3's tokenizer and chat template, qwen3 parser)
    with the scripted engine always giving VERDICT; records what it was asked. Started with the
    module, so that its start-up overlaps the other tests (the test that uses it runs last)."""
    tmp = tmp_path_factory.mktemp("judge")
    config = write_config(tmp / "judge.yaml", {"engine": {"name": "scripted", "options": {"script": [VERDICT]}}})
    server = ServeProcess(config, "--record", str(tmp / "record"), "--idle-timeout", "1", log=tmp / "judge.log",
                          env=env_with())
    try:
        yield server
    finally:
        server.stop()


def _eval(tmp_path: Path, judge: dict[str, Any], num_samples: int = 2) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``toolrl eval`` of the tiny model on arithmetic, scored by gsm8k and the judge (weight 2)."""
    config = write_config(tmp_path / "eval.yaml", {
        "reward": {"functions": [{"name": "gsm8k"}, {"name": "judge", "weight": 2.0, "options": judge}]},
        "rollout": {"max_new_tokens": 8, "max_response_tokens": 16}})
    out = tmp_path / "eval"
    result = toolrl("eval", str(config), f"eval.num_samples={num_samples}", "--output", str(out))
    assert result.exit_code == 0, result.output[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), rows


@pytest.mark.parametrize("judge", ["down", "garbage"])
def test_a_failed_judgement_is_an_error_term_and_the_run_completes(judge: str, tmp_path: Path) -> None:
    server = None if judge == "down" else JudgeServer(judge)
    try:
        url = server.url if server is not None else f"http://127.0.0.1:{free_port()}/v1"
        summary, rows = _eval(tmp_path, {"base_url": url, "model": "judge", "retries": 1, "retry_backoff_s": 0.0,
                                         "timeout_s": 10})
    finally:
        if server is not None:
            server.close()
    why = {"down": "Connect", "garbage": "unreadable verdict (no <score>"}[judge]
    assert summary["errors"] == 2 and len(rows) == 2
    for row in rows:
        assert "no verdict after 2 tries" in row["reward_errors"]["judge"] and why in row["reward_errors"]["judge"]
        assert row["reward_terms"]["judge"] == 0.0 and "gsm8k" not in row["reward_errors"]
        assert row["error"].startswith("reward judge: JudgeError") and not row["success"]
    if server is not None:
        assert len(server.prompts) == 4  # each judgement tried twice


def test_judgements_overlap_the_rollout_loop_and_each_other(tmp_path: Path) -> None:
    """Every judgement of the run is held until all four are in flight: they finish only if the loop
    kept generating while earlier trajectories' judgements waited, and judged them all at once."""
    server = JudgeServer("gate", gate=4)
    try:
        summary, rows = _eval(tmp_path, {"base_url": server.url, "model": "judge"}, num_samples=4)
    finally:
        server.close()
    assert summary["errors"] == 0 and [r["reward_terms"]["judge"] for r in rows] == [2.0] * 4
    assert server.max_in_flight == 4


async def test_concurrency_caps_judgements_in_flight() -> None:
    from toolrl.schemas import Sample

    server = JudgeServer("gate", gate=3, hold_s=5.0)
    try:
        judge = built_judge(base_url=server.url, model="judge", concurrency=3, retries=0)
        sample = Sample(prompt=[{"role": "user", "content": "What is 2+3?"}], ground_truth="5")
        scores = await asyncio.gather(*(judge(f"It is {k}.", "5", sample=sample) for k in range(9)))
    finally:
        server.close()
    assert scores == [1.0] * 9 and server.max_in_flight == 3  # three at a time: each gate of three opened


@pytest.mark.parametrize(("mode", "last"), [("broken", "answered 500"), ("not_json", "malformed answer (JSONDecodeError")])
async def test_a_judge_answering_errors_raises_one_line_after_its_retries(mode: str, last: str) -> None:
    from toolrl_openai.judge import JudgeError

    server = JudgeServer(mode)
    try:
        judge = built_judge(base_url=server.url, model="judge", retries=2, retry_backoff_s=0.0)
        with pytest.raises(JudgeError, match=rf"^judge judge at http\S+: no verdict after 3 tries; last: {re.escape(last)}"):
            await judge("5", "5")
    finally:
        server.close()
    assert len(server.prompts) == 3


def test_verdict_parsers_and_option_errors() -> None:
    from toolrl_openai.judge import VerdictError

    def verdict(**options: Any) -> Any:
        return built_judge(base_url="http://127.0.0.1:1/v1", model="m", verdict=options).options.verdict

    ten = verdict(type="tag", tag="grade", min=1, max=10)
    assert ten.parse("<grade>1</grade> no: <grade> 7 </grade>") == pytest.approx(6 / 9)
    yes_no = verdict(type="yes_no", yes=["yes", "correct"], no=["no", "incorrect"])
    assert yes_no.parse("Not 'no' at first... Verdict: Correct.") == 1.0 and yes_no.parse("YES, then no") == 0.0
    assert verdict(type="regex", pattern=r"Grade: ([A-C])", values={"A": 1, "B": 0.5, "C": 0}).parse("Grade: B") == 0.5
    assert verdict(type="regex", pattern=r"(?P<score>[\d.]+)/10").parse("7/10, I mean 8.5/10") == 8.5
    for parser, text in [(ten, "<grade>11</grade>"), (ten, "<grade>high</grade>"), (yes_no, "maybe"),
                         (verdict(type="regex", pattern=r"Grade: (\w)", values={"A": 1}), "Grade: Z")]:
        with pytest.raises(VerdictError):
            parser.parse(text)
    for options, message in [({"prompt": "Grade {answer}"}, "prompt: unknown placeholder {answer}"),
                             ({"verdict": {"type": "regex", "pattern": "no group"}}, "verdict.regex.pattern: "),
                             ({"retries": -1}, "retries: "), ({"modle": "x"}, "modle: unknown key")]:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}") as caught:
            built_judge(**{"base_url": "http://127.0.0.1:1/v1", "model": "m", **options})
        assert "\n" not in str(caught.value)


def test_a_judge_served_by_toolrl_serve_scores_the_rollouts(judge_process: ServeProcess, tmp_path: Path) -> None:
    judge_server = judge_process.wait()
    summary, rows = _eval(tmp_path, {"base_url": judge_server.url, "model": "tiny-qwen3"})
    assert summary["errors"] == 0 and len(rows) == 2
    for row in rows:
        # 0.75 (its reasoning's <score>0</score> does not count), weighted 2, beside gsm8k's own term.
        assert row["reward_terms"]["judge"] == pytest.approx(1.5) and "gsm8k" in row["reward_terms"]
        assert row["reward_errors"] == {} and row["error"] is None
    # The rubric the judge read holds each problem's question, reference answer and final answer.
    asked = recorded(judge_server, 2, lambda r: "grading an assistant's answer" in r["prompt_text"])
    assert len(asked) == 2
    for row in rows:
        question = row["prompt_text"].split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]
        assert any(question in a["prompt_text"] and f"Reference answer:\n{row['ground_truth']}\n" in a["prompt_text"]
                   for a in asked), question
