"""GRPO raises the reward on the lookup-chain environment's multi-turn path, with the tiny random
Qwen3 (its embeddings scaled up so its next-token distributions are peaked, as the core's learning
tests do).

The tiny model cannot write ``<lookup>`` calls, so part of each turn is fixed: the model samples
``FREE`` tokens per turn, and they choose the action — when at least half of them are from the half of
the vocabulary whose (initial) embedding points to the positive side of a fixed direction, the turn
takes the right step (look up the key the last result revealed, or answer the value once it is shown),
else it answers a wrong value, which loses the episode. The engine writes the chosen call after the
sampled tokens (in the trajectory as the model's, with logprob 0), so the rest is the real path: the
tags parser stops at the call, the session keeps the revealed keys and feeds the entry back inline,
``done`` ends the episode, the session's score (1 solved, 0.2 × the hops looked up otherwise) is the
reward, and GRPO trains the whole multi-turn response. Solving takes three right turns in a row.
Measured: one sampled token per turn is too sparse a signal for 16 steps (the reward stayed near 0.2).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
from toolrl.config import load_config
from toolrl.engines import Generation, SamplingParams
from toolrl.engines.transformers import TransformersEngine
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import Part

FREE = 8  # tokens the model samples per turn
OUTPUT = re.compile(r"```output\n(.*?)\n```", re.DOTALL)


class ChoosingEngine(TransformersEngine):
    """The real transformers engine sampling FREE tokens per turn, which choose the call (module doc)."""

    name = "lookup-choosing"
    good: ClassVar[Any] = None  # bool tensor over the vocabulary, set by the fixture

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None, images: Any = ()) -> list[Generation]:
        free = replace(params, max_new_tokens=FREE, stop_strings=[], stop_token_ids=[])
        (gen,) = await super().generate(prompt_ids, free, 1, session_id)
        right = 2 * sum(bool(self.good[t]) for t in gen.token_ids) >= len(gen.token_ids)
        text = self.tokenizer.decode(prompt_ids)
        episode = text[text.rindex("Start at key "):]  # the problem, after the worked example
        results = OUTPUT.findall(episode)
        if not right:
            call = "<answer>0</answer>"
        elif not results:
            call = f"<lookup>{episode.split()[3].rstrip('.')}</lookup>"
        elif "the value is" in results[-1]:
            call = f"<answer>{results[-1].split()[-1]}</answer>"
        else:
            call = f"<lookup>{results[-1].split()[-2]}</lookup>"
        ids = self.tokenizer.encode(call, add_special_tokens=False)
        stop = call[call.rindex("</"):]
        return [replace(gen, token_ids=gen.token_ids + ids, logprobs=gen.logprobs + [0.0] * len(ids),
                        finish_reason="stop_string", stop=stop)]


@pytest.fixture(scope="module")
def peaked_tiny_model(tmp_path_factory: Any) -> Path:
    import torch
    from toolrl.model_sources import load_model, tiny_qwen3

    source = Path(tiny_qwen3())
    out = tmp_path_factory.mktemp("peaked")
    model = load_model(str(source))
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(6.0)
    ChoosingEngine.good = model.get_input_embeddings().weight[:, 0] > 0
    model.save_pretrained(out)
    for f in source.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja") or f.name == "special_tokens_map.json":
            shutil.copy2(f, out / f.name)
    return out


@pytest.mark.slow
@pytest.mark.timeout(1200)  # minutes under load; the core learning tests take about one each on an idle CPU
def test_grpo_raises_the_reward_on_the_multi_turn_path(tmp_path: Path, peaked_tiny_model: Path) -> None:
    from toolrl.processes.controller import train_async

    registry = get_plugins().registry
    if not registry.has("rollout_engines", ChoosingEngine.name):
        registry.add(Part("rollout_engines", ChoosingEngine.name, "tests", ChoosingEngine))
    config = load_config(None, data={
        "model": {"source": str(peaked_tiny_model)}, "env": "lookup-chain",
        "env_options": {"hops": 2, "train_size": 64, "test_size": 8},
        "engine": {"name": ChoosingEngine.name}, "data": {"batch_size": 2},
        "rollout": {"n": 8, "temperature": 1.0, "max_new_tokens": 16, "max_response_tokens": 192},
        "algorithm": {"loss_agg": "token-mean"}, "optim": {"lr": 5.0e-3, "micro_batch_size": 16},
        "trainer": {"total_steps": 16, "output_dir": str(tmp_path), "plot": False, "progress": False,
                    "save_every": 100}})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    asyncio.run(train_async(config))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in rows]
    first, last = sum(rewards[:2]) / 2, sum(rewards[-4:]) / 4
    assert last > first + 0.1, rewards
    traces = [json.loads(line) for line in (tmp_path / "rollouts" / "step_00016.jsonl").read_text().splitlines()]
    solved = [t for t in traces if t["reward"] == 1.0]
    assert solved and all(t["turns"] == 3 and len(t["tool_results"]) == 3 and t["termination"] == "done"
                          for t in solved)
