"""``toolrl eval`` through the ``openai`` engine against ``toolrl serve``, and ``toolrl train`` on what
``toolrl serve --record`` wrote for conversations the official ``openai`` client held."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import openai
from support import TINY_YAML, ServeProcess, recorded, toolrl
from test_serve_chat import TOOLS


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_eval_against_toolrl_serve(tiny_server: ServeProcess, tmp_path: Path) -> None:
    split = tmp_path / "test.jsonl"
    split.write_text("".join(json.dumps({"prompt": f"What is {a} + 1?", "reward_model": {"ground_truth": str(a + 1)}})
                             + "\n" for a in range(3)))
    out = tmp_path / "eval"
    result = toolrl("eval", str(TINY_YAML), f"data.test_files=[{split}]", "engine.name=openai",
                    f"engine.options.base_url={tiny_server.url}", "eval.num_samples=2", "rollout.max_new_tokens=8",
                    "--output", str(out))
    assert result.exit_code == 0, result.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["engine"], summary["num_samples"], summary["errors"]) == ("openai", 2, 0)
    rows = _lines(out / "results.jsonl")
    assert sorted(r["problem"] for r in rows) == [0, 1]
    assert all(r["error"] is None and sum(r["response_mask"]) > 0 for r in rows)


def test_recorded_conversations_train_one_step(scripted_server: ServeProcess, tmp_path: Path) -> None:
    """Two conversations that begin alike form one group: the scripted model calls the calculator;
    one client sends the tool's result and gets the answer, the other stops after the call. Labelled
    with the task's answer, the configured reward (gsm8k) scores them 1 and 0, and a step trains."""
    question = [{"role": "user", "content": "What is 2+3? (recorded for training)"}]
    client = openai.OpenAI(base_url=scripted_server.url, api_key="EMPTY", max_retries=0)
    try:
        first = client.chat.completions.create(model="tiny-qwen3", messages=question, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        reply = first.choices[0].message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
        client.chat.completions.create(model="tiny-qwen3", tools=TOOLS, messages=[
            *question, reply, {"role": "tool", "tool_call_id": call.id, "content": "5"}])
        client.chat.completions.create(model="tiny-qwen3", messages=question, tools=TOOLS)  # stops at the call
    finally:
        client.close()
    rows = recorded(scripted_server, 2, lambda r: "(recorded for training)" in r["prompt_text"])
    assert sorted(r["turns"] for r in rows) == [1, 2]
    assert "reward" not in rows[0] and "group" not in rows[0]  # nobody has scored a served conversation
    data = tmp_path / "trajectories.jsonl"
    data.write_text("".join(json.dumps({**r, "ground_truth": "5"}) + "\n" for r in rows))

    out = tmp_path / "run"
    result = toolrl("train", str(TINY_YAML), f"data.trajectories={data}", "data.batch_size=1", "trainer.total_steps=1",
                    "trainer.progress=false", "trainer.plot=false", f"trainer.output_dir={out}")
    assert result.exit_code == 0, result.output[-3000:]
    (metrics,) = _lines(out / "metrics.jsonl")
    assert metrics["step"] == 1 and math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    trained = _lines(out / "rollouts" / "step_00001.jsonl")
    assert sorted(t["reward"] for t in trained) == [0.0, 1.0]
    assert len({t["group"] for t in trained}) == 1
    assert sorted(t["response_ids"] for t in trained) == sorted(r["response_ids"] for r in rows)
