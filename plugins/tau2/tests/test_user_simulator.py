"""The user simulated by a model under ``toolrl serve`` (the tiny random Qwen3 of examples/tiny.yaml,
on loopback, called through τ²'s UserSimulator and litellm): the conversation opens as τ²'s does (the
agent's greeting, the user's first message, in the prompt), the trajectory runs to its end and every
later user turn is in the response as environment tokens (mask 0), exactly the chat template's tokens."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import rollout
from toolrl.renderers.chat import ChatRenderer
from toolrl.testing import ScriptedEngine

REPO = Path(__file__).resolve().parents[3]
GREETING = "How can I help you today?"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``toolrl serve examples/tiny.yaml --port 0``: its (base URL, model name)."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "toolrl", "serve", str(REPO / "examples" / "tiny.yaml"),
                                 "--port", "0"], stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            deadline = time.monotonic() + 180
            while not (m := re.search(r"serving (\S+) at (http://\S+/v1)", log.read_text())):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            yield m.group(2), m.group(1)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def qwen25() -> Any:
    """The agent's tokenizer: Qwen2.5's template is append-only at user turns (Qwen3's drops earlier
    turns' reasoning when the user speaks again, so no user turn can be appended token-exactly)."""
    from toolrl import model_sources

    return model_sources.qwen_tokenizer("qwen2_5")


async def test_a_served_user_talks_until_its_turns_run_out(served, qwen25) -> None:
    tokenizer = qwen25
    base_url, model = served
    options = {"user": {"base_url": base_url, "model": model}, "max_user_turns": 3}
    talker = ScriptedEngine(tokenizer, [GREETING])  # an agent that only talks: every answer goes to the user
    [t] = await rollout("tau2-airline", talker, tokenizer, env_options=options, limit=1, max_new_tokens=64)
    assert t.error is None and t.termination == "answered" and t.turns == 3
    assert len(t.user_turns) == 2 and all(isinstance(u, str) for u in t.user_turns)
    # τ²'s opening: the agent greets, the simulated user writes the first user message.
    prompt = tokenizer.decode(t.prompt_ids)
    greeting = "<|im_start|>assistant\nHi! How can I help you today?<|im_end|>\n<|im_start|>user\n"
    assert greeting in prompt and prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "Hi!<|im_end|>" not in prompt.split(greeting)[0]  # no scripted user opening before it
    # The response is answer, user turn, answer, user turn, answer; the user turns are mask 0 and are
    # exactly what the chat template adds for them.
    renderer = ChatRenderer(tokenizer)
    runs: list[tuple[int, list[int]]] = []
    for tok, m in zip(t.response_ids, t.response_mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(tok)
        else:
            runs.append((m, [tok]))
    assert [m for m, _ in runs] == [1, 0, 1, 0, 1]
    assert [ids for m, ids in runs if m == 0] == [renderer.tool_delta([{"role": "user", "content": u}])
                                                  for u in t.user_turns]
    assert all(p == 0.0 for p, m in zip(t.logprobs, t.response_mask) if m == 0)
